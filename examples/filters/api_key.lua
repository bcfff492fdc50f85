-- pre: requests under /private need the demo key; others pass untouched.
return {
  stage = "pre",
  order = 5,
  match = { path_prefix = "/private" },
  should_filter = function(ctx)
    return ctx:method() ~= "OPTIONS"
  end,
  run = function(ctx)
    if ctx:header("x-api-key") ~= "let-me-in" then
      ctx:respond(401, { ["content-type"] = "text/plain", ["www-authenticate"] = "ApiKey" },
        "missing or wrong api key\n")
    end
  end,
}
