-- post (body opt-in): responses under /wrap are wrapped in a JSON envelope.
return {
  stage = "post",
  order = 20,
  response_body = true,
  match = { path_prefix = "/wrap" },
  run = function(ctx)
    local body = ctx:response_body() or ""
    ctx:set_response_header("content-type", "application/json")
    ctx:set_response_body('{"status":' .. ctx:response_status() .. ',"length":' .. #body .. '}\n')
  end,
}
