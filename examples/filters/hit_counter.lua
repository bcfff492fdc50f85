-- pre: count requests per route across all workers (shared dictionary, 60 s window).
return {
  stage = "pre",
  order = 20,
  run = function(ctx)
    local n = shared.incr("hits:" .. ctx:route(), 1, 60)
    ctx:set_header("x-hits", tostring(n))
  end,
}
