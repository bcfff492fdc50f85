-- error: a JSON error page naming the failed filter (never the message: it may hold secrets).
return {
  stage = "error",
  order = 10,
  run = function(ctx)
    local f = ctx:failure()
    if f and f.filter ~= "proxy" then
      ctx:respond(503, { ["content-type"] = "application/json" },
        '{"error":"filter_failed","filter":"' .. f.filter .. '"}\n')
    end
  end,
}
