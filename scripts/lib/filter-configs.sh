# The issue-4 filter chain configs, shared by the filter benchmark scripts: writes
# $WORK/none.toml, $WORK/native.toml and $WORK/lua.toml (+ $WORK/lua/*.lua) for a gateway on
# $PORT in front of a stub on $STUB_PORT. Three trivial filters: a pre filter setting a request
# header, a route filter choosing the cluster, a post filter adding a response header.
base() { cat <<TOML
[server]
workers = 1
[admin]
listen = "off"
[[listeners]]
name = "main"
address = "127.0.0.1:$PORT"
[[clusters]]
name = "origin"
servers = [{ address = "127.0.0.1:$STUB_PORT" }]
[[clusters]]
name = "other"
servers = [{ address = "127.0.0.1:$STUB_PORT" }]
[[routes]]
name = "all"
cluster = "other"
TOML
}

base > "$WORK/none.toml"
{ base; cat <<TOML
[[filters]]
name = "in"
type = "headers"
stage = "pre"
set = { x-in = "1" }
[[filters]]
name = "pick"
type = "reroute"
stage = "route"
cluster = "origin"
[[filters]]
name = "out"
type = "headers"
stage = "post"
add = { x-out = "1" }
TOML
} > "$WORK/native.toml"
mkdir -p "$WORK/lua"
echo 'return { stage = "pre", run = function(ctx) ctx:set_header("x-in", "1") end }' > "$WORK/lua/in.lua"
echo 'return { stage = "route", run = function(ctx) ctx:set_cluster("origin") end }' > "$WORK/lua/pick.lua"
echo 'return { stage = "post", run = function(ctx) ctx:add_response_header("x-out", "1") end }' > "$WORK/lua/out.lua"
{ base; printf '[lua]\ndir = "%s"\nwatch = false\n' "$WORK/lua"; } > "$WORK/lua.toml"

