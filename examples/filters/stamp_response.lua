-- post: tell the client Lua saw the response (and which route it took).
return {
  stage = "post",
  order = 10,
  run = function(ctx)
    ctx:set_response_header("x-lua-post", ctx:meta("lua.route") or "-")
  end,
}
