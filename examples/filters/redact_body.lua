-- pre (body opt-in): uploads under /upload never carry a clear-text password upstream.
-- Only requests this filter matches are buffered; everything else streams untouched.
return {
  stage = "pre",
  order = 30,
  request_body = true,
  match = { path_prefix = "/upload", methods = { "POST", "PUT" } },
  run = function(ctx)
    local body = ctx:request_body() or ""
    local redacted = string.gsub(body, "password=[^&]*", "password=***")
    ctx:set_request_body(redacted)
  end,
}
