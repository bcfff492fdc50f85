//! The `http` global (also `ctx.http`): `http.get(url, opts)`, `http.post(url, body, opts)`
//! and `http.request(method, url, opts)` with `opts = {timeout = seconds, headers = {...},
//! body = "..."}`. A call is a Rust future awaited by the filter's coroutine: the coroutine
//! yields, the worker serves other requests, and the coroutine resumes with `response, nil`
//! or `nil, "error text"` (timeouts, connection and TLS failures are values, not Lua
//! errors). The response is `{status=, body=, headers={}}`.
//!
//! | module | owns |
//! |---|---|
//! | here | the Lua functions, a call's options |
//! | `client` | one exchange: connect or reuse, send, read, retry once |
//! | `pool` | each worker's idle connections |
//! | `tls` | the trust anchors and the TLS handshake |
//! | `guard` | the admin listener, which calls may not reach |
//! | `metrics` | calls by result, connections opened and reused |

mod client;
mod guard;
mod metrics;
mod pool;
mod tls;

pub(crate) use client::Client;
pub(crate) use guard::AdminGuard;
pub(crate) use metrics::HttpMetrics;
pub(crate) use tls::Trust;

use bytes::Bytes;
use http::Method;
use mlua::{Lua, LuaString, Table, Value};
use std::sync::Arc;
use std::time::Duration;

use client::Call;

/// A call's timeout: `opts.timeout` (seconds > 0) cut to `http_max_timeout`, else the
/// default `http_timeout`.
fn timeout(opts: Option<&Table>, c: &Client) -> mlua::Result<Duration> {
    let Some(t) = opts
        .map(|o| o.get::<Option<f64>>("timeout"))
        .transpose()?
        .flatten()
    else {
        return Ok(c.timeout);
    };
    if !(t.is_finite() && t > 0.0) {
        return Err(mlua::Error::runtime(
            "timeout must be a number of seconds > 0",
        ));
    }
    Ok(Duration::from_secs_f64(t.min(c.max_timeout.as_secs_f64())))
}

fn call_from(
    method: Method,
    url: String,
    body: Option<LuaString>,
    opts: Option<Table>,
    c: &Client,
) -> mlua::Result<Call> {
    let headers = match &opts {
        Some(o) => crate::ctx::from_table(o.get::<Option<Table>>("headers")?)?,
        None => http::HeaderMap::new(),
    };
    let body = match body {
        Some(b) => Some(b),
        None => match &opts {
            Some(o) => o.get::<Option<LuaString>>("body")?,
            None => None,
        },
    };
    Ok(Call {
        method,
        url,
        body: body.map_or_else(Bytes::new, |b| Bytes::from(b.as_bytes().to_vec())),
        headers,
        timeout: timeout(opts.as_ref(), c)?,
    })
}

async fn perform(lua: Lua, client: Arc<Client>, call: Call) -> mlua::Result<(Value, Value)> {
    let r = match client.send(call).await {
        Ok(r) => r,
        Err(f) => return Ok((Value::Nil, Value::String(lua.create_string(f.text)?))),
    };
    let t = lua.create_table()?;
    t.set("status", r.status)?;
    t.set("body", lua.create_string(&r.body)?)?;
    let h = lua.create_table()?;
    for (k, v) in r.headers.iter() {
        if let Ok(v) = v.to_str() {
            h.set(k.as_str(), v)?;
        }
    }
    t.set("headers", h)?;
    Ok((Value::Table(t), Value::Nil))
}

fn method(m: &str) -> mlua::Result<Method> {
    Method::from_bytes(m.to_ascii_uppercase().as_bytes())
        .map_err(|_| mlua::Error::runtime(format!("{m:?} is not an HTTP method")))
}

/// `http.get(url, opts)`, `http.post(url, body, opts)`, `http.request(method, url, opts)`.
pub(crate) fn table(lua: &Lua, client: Arc<Client>) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    let c = client.clone();
    t.set(
        "get",
        lua.create_async_function(move |lua, (url, opts): (String, Option<Table>)| {
            let (c, call) = (c.clone(), call_from(Method::GET, url, None, opts, &c));
            async move { perform(lua, c, call?).await }
        })?,
    )?;
    let c = client.clone();
    t.set(
        "post",
        lua.create_async_function(
            move |lua, (url, body, opts): (String, Option<LuaString>, Option<Table>)| {
                let (c, call) = (c.clone(), call_from(Method::POST, url, body, opts, &c));
                async move { perform(lua, c, call?).await }
            },
        )?,
    )?;
    let c = client;
    t.set(
        "request",
        lua.create_async_function(
            move |lua, (m, url, opts): (String, String, Option<Table>)| {
                let call = method(&m).and_then(|m| call_from(m, url, None, opts, &c));
                let c = c.clone();
                async move { perform(lua, c, call?).await }
            },
        )?,
    )?;
    Ok(t)
}
