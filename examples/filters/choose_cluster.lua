-- route: canary requests go to the "canary" cluster.
return {
  stage = "route",
  order = 10,
  match = { headers = { "x-canary" } },
  run = function(ctx)
    if ctx:header("x-canary") == "1" then
      ctx:set_cluster("canary")
    end
  end,
}
