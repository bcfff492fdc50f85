-- pre: stamp every request with a header the origin sees, and remember when it started.
return {
  stage = "pre",
  order = 10,
  run = function(ctx)
    ctx:set_header("x-lua", "1")
    ctx:set_meta("lua.route", ctx:route())
  end,
}
