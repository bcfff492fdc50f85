//! The `ctx` a Lua filter receives: [`FilterCtx`] registered as a Lua userdata type, with
//! methods mirroring the native API (`ctx:method()`, `ctx:set_header(n, v)`, ...). In
//! `should_filter` it is a read-only borrow (mutating methods raise an error); in `run` the
//! script owns it for the call and the host moves it back afterwards. `ctx.http` is the
//! non-blocking HTTP client (see `api`).

use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, StatusCode};
use keymaster_gateway::filter::FilterCtx;
use mlua::{
    FromLuaMulti, IntoLuaMulti, Lua, Table, UserDataFields, UserDataMethods, UserDataRegistry,
    Value,
};

fn name(n: &str) -> mlua::Result<HeaderName> {
    HeaderName::from_bytes(n.as_bytes())
        .map_err(|_| mlua::Error::runtime(format!("invalid header name {n:?}")))
}

fn value(v: &str) -> mlua::Result<HeaderValue> {
    HeaderValue::from_str(v)
        .map_err(|_| mlua::Error::runtime(format!("invalid header value {v:?}")))
}

fn status(n: u16) -> mlua::Result<StatusCode> {
    StatusCode::from_u16(n).map_err(|_| mlua::Error::runtime(format!("invalid status {n}")))
}

/// Every value of `n` in `h`, joined with ", " (nil when absent).
fn get(h: &HeaderMap, n: &str) -> Option<String> {
    let mut it = h.get_all(n).iter().filter_map(|v| v.to_str().ok());
    let first = it.next()?.to_string();
    Some(it.fold(first, |acc, v| acc + ", " + v))
}

fn to_table(lua: &Lua, h: &HeaderMap) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    for k in h.keys() {
        if let Some(v) = get(h, k.as_str()) {
            t.set(k.as_str(), v)?;
        }
    }
    Ok(t)
}

/// A Lua `{name = value}` table as a header map.
pub(crate) fn from_table(t: Option<Table>) -> mlua::Result<HeaderMap> {
    let mut h = HeaderMap::new();
    if let Some(t) = t {
        for pair in t.pairs::<String, String>() {
            let (k, v) = pair?;
            h.append(name(&k)?, value(&v)?);
        }
    }
    Ok(h)
}

/// A method that reads the context. Every method first checks that `ctx` is the context of
/// the call running now ([`crate::vm::owns`]): a `ctx` a script kept in a global from an
/// earlier call fails instead of reaching another request's context (worker VMs reuse the
/// userdata that carries contexts).
fn reader<A, R, F>(r: &mut UserDataRegistry<FilterCtx>, name: &str, f: F)
where
    A: FromLuaMulti,
    R: IntoLuaMulti,
    F: Fn(&Lua, &FilterCtx, A) -> mlua::Result<R> + 'static,
{
    r.add_method(name, move |lua, c, a| {
        crate::vm::owns(c)?;
        f(lua, c, a)
    });
}

/// A method that changes the context (an error in `should_filter`, where it is read-only).
fn writer<A, R, F>(r: &mut UserDataRegistry<FilterCtx>, name: &str, f: F)
where
    A: FromLuaMulti,
    R: IntoLuaMulti,
    F: Fn(&Lua, &mut FilterCtx, A) -> mlua::Result<R> + 'static,
{
    r.add_method_mut(name, move |lua, c, a| {
        crate::vm::owns(c)?;
        f(lua, c, a)
    });
}

/// Register `FilterCtx` as a userdata type in `lua`.
pub(crate) fn register(lua: &Lua) -> mlua::Result<()> {
    lua.register_userdata_type::<FilterCtx>(methods)
}

fn methods(r: &mut UserDataRegistry<FilterCtx>) {
    r.add_field_method_get("http", |lua, _| {
        lua.named_registry_value::<Value>("keymaster.http")
    });
    // Request facts.
    reader(r, "stage", |_, c, ()| Ok(c.stage().as_str()));
    reader(r, "method", |_, c, ()| Ok(c.method().as_str().to_string()));
    reader(r, "path", |_, c, ()| Ok(c.path().to_string()));
    reader(r, "query", |_, c, ()| Ok(c.query().map(str::to_string)));
    reader(r, "route", |_, c, ()| Ok(c.route().to_string()));
    reader(r, "client_ip", |_, c, ()| Ok(c.client_ip().to_string()));
    reader(r, "client_port", |_, c, ()| Ok(c.client_addr().port()));
    reader(r, "tls", |lua, c, ()| {
        if !c.is_tls() {
            return Ok(None);
        }
        let t = lua.create_table()?;
        t.set("client_identity", c.tls_client_identity())?;
        Ok(Some(t))
    });
    // Request headers.
    reader(r, "header", |_, c, n: String| {
        Ok(get(c.request_headers(), &n))
    });
    reader(r, "headers", |lua, c, ()| {
        to_table(lua, c.request_headers())
    });
    writer(r, "set_header", |_, c, (n, v): (String, String)| {
        c.set_request_header(name(&n)?, value(&v)?);
        Ok(())
    });
    writer(r, "add_header", |_, c, (n, v): (String, String)| {
        c.append_request_header(name(&n)?, value(&v)?);
        Ok(())
    });
    writer(r, "remove_header", |_, c, n: String| {
        c.remove_request_header(&name(&n)?);
        Ok(())
    });
    // Per-request values shared by the filters of one request.
    reader(r, "meta", |_, c, k: String| Ok(c.meta().get(&k).cloned()));
    writer(r, "set_meta", |_, c, (k, v): (String, Option<String>)| {
        match v {
            Some(v) => c.meta_mut().insert(k, v),
            None => c.meta_mut().remove(&k),
        };
        Ok(())
    });
    // Routing.
    reader(r, "cluster", |_, c, ()| {
        Ok(c.upstream_cluster().map(str::to_string))
    });
    writer(r, "set_cluster", |_, c, n: String| {
        c.set_cluster(n);
        Ok(())
    });
    writer(r, "set_upstream_path", |_, c, p: String| {
        if !p.starts_with('/') {
            return Err(mlua::Error::runtime(
                "the upstream path must start with '/'",
            ));
        }
        c.set_upstream_path(p);
        Ok(())
    });
    writer(r, "set_upstream_host", |_, c, h: String| {
        c.set_upstream_host(value(&h)?);
        Ok(())
    });
    // Answering.
    writer(
        r,
        "respond",
        |_, c, (s, h, body): (u16, Option<Table>, Option<mlua::LuaString>)| {
            let body = body.map(|b| b.as_bytes().to_vec()).unwrap_or_default();
            c.respond(status(s)?, from_table(h)?, body);
            Ok(())
        },
    );
    reader(r, "responded", |_, c, ()| Ok(c.responded()));
    // The response (post, and error after a proxy failure).
    reader(r, "response_status", |_, c, ()| {
        Ok(c.response_status().map(|s| s.as_u16()))
    });
    writer(r, "set_response_status", |_, c, s: u16| {
        c.set_response_status(status(s)?);
        Ok(())
    });
    reader(r, "response_header", |_, c, n: String| {
        Ok(c.response_headers().and_then(|h| get(h, &n)))
    });
    reader(r, "response_headers", |lua, c, ()| {
        match c.response_headers() {
            Some(h) => to_table(lua, h).map(Some),
            None => Ok(None),
        }
    });
    writer(
        r,
        "set_response_header",
        |_, c, (n, v): (String, String)| {
            let (n, v) = (name(&n)?, value(&v)?);
            if let Some(h) = c.response_headers_mut() {
                h.insert(n, v);
            }
            Ok(())
        },
    );
    writer(
        r,
        "add_response_header",
        |_, c, (n, v): (String, String)| {
            let (n, v) = (name(&n)?, value(&v)?);
            c.append_response_header(n, v);
            Ok(())
        },
    );
    writer(r, "remove_response_header", |_, c, n: String| {
        let n = name(&n)?;
        if let Some(h) = c.response_headers_mut() {
            h.remove(n);
        }
        Ok(())
    });
    // Bodies (only when the file declares request_body / response_body = true).
    reader(r, "request_body", |lua, c, ()| match c.request_body() {
        Some(b) => lua.create_string(b).map(Some),
        None => Ok(None),
    });
    writer(r, "set_request_body", |_, c, b: mlua::LuaString| {
        c.set_request_body(b.as_bytes().to_vec());
        Ok(())
    });
    reader(r, "response_body", |lua, c, ()| match c.response_body() {
        Some(b) => lua.create_string(b).map(Some),
        None => Ok(None),
    });
    writer(r, "set_response_body", |_, c, b: mlua::LuaString| {
        c.set_response_body(b.as_bytes().to_vec());
        Ok(())
    });
    // The error stage: what failed.
    reader(r, "failure", |lua, c, ()| match c.failure() {
        Some(f) => {
            let t = lua.create_table()?;
            t.set("filter", &*f.filter)?;
            t.set("stage", f.stage.as_str())?;
            t.set("message", f.message.as_str())?;
            Ok(Some(t))
        }
        None => Ok(None),
    });
}
