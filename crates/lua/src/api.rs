//! The globals keymaster adds to the sandbox: `shared` (the process-wide dictionary) and
//! `http` (also `ctx.http`): `http.get(url, opts)` and `http.post(url, body, opts)` with
//! `opts = {timeout = seconds, headers = {...}}`. An HTTP call is a Rust future awaited by
//! the filter's coroutine: the coroutine yields, the worker serves other requests, and the
//! coroutine resumes with `response, nil` or `nil, "error text"` (timeouts and connection
//! failures are values, not Lua errors). The response is `{status=, body=, headers={}}`.
//! One connection per call to `http://` URLs (no TLS, no pooling). The host is resolved
//! first and each address checked before it is connected to: the admin listener is refused
//! ([`AdminGuard`]) unless `[lua] http_allow_admin`, and the checked address is the one
//! connected to (no second resolution a rebinding DNS answer could change).

use bytes::Bytes;
use http::{header, Method, Request};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use mlua::{Lua, Table, Value};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::dict::{DictValue, NoMemory, SharedDict};
use crate::set::Settings;

fn ttl(v: Option<f64>) -> mlua::Result<Option<Duration>> {
    match v {
        None => Ok(None),
        Some(s) if s.is_finite() && s >= 0.0 => Ok(Some(Duration::from_secs_f64(s))),
        Some(_) => Err(mlua::Error::runtime("ttl must be a number of seconds >= 0")),
    }
}

/// Charge the running call for copying `bytes` bytes into or out of the dictionary.
fn charge(bytes: usize) -> mlua::Result<()> {
    crate::meter::charge_bytes(bytes).map_err(mlua::Error::runtime)
}

/// A Lua value as a dictionary value: `None` for nil (`set` then deletes the key).
fn dict_value(v: Value) -> mlua::Result<Option<DictValue>> {
    Ok(Some(match v {
        Value::Integer(i) => DictValue::Number(i as f64),
        Value::Number(n) => DictValue::Number(n),
        Value::String(s) => {
            let bytes = s.as_bytes();
            charge(bytes.len())?;
            DictValue::Text(Bytes::copy_from_slice(&bytes))
        }
        Value::Nil => return Ok(None),
        _ => return Err(mlua::Error::runtime("shared values are numbers or strings")),
    }))
}

const NO_MEMORY: &str = "no memory";

/// `shared.get(k)`, `shared.set(k, v, ttl)` (`true, nil, forcible` or `nil, "no memory"`),
/// `shared.safe_set(k, v, ttl)` (`true` or `nil, "no memory"`), `shared.incr(k, delta,
/// ttl)`, `shared.delete(k)`.
pub(crate) fn shared_table(lua: &Lua, dict: Arc<SharedDict>) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    let d = dict.clone();
    t.set(
        "get",
        lua.create_function(move |lua, k: String| {
            Ok(match d.get(&k) {
                Some(DictValue::Number(n)) => Value::Number(n),
                Some(DictValue::Text(s)) => {
                    charge(s.len())?;
                    Value::String(lua.create_string(s)?)
                }
                None => Value::Nil,
            })
        })?,
    )?;
    let d = dict.clone();
    t.set(
        "set",
        lua.create_function(move |lua, (k, v, t): (String, Value, Option<f64>)| {
            let Some(v) = dict_value(v)? else {
                d.delete(&k);
                return Ok((Value::Boolean(true), Value::Nil, Value::Boolean(false)));
            };
            Ok(match d.set(&k, v, ttl(t)?) {
                Ok(forcible) => (Value::Boolean(true), Value::Nil, Value::Boolean(forcible)),
                Err(NoMemory) => (
                    Value::Nil,
                    Value::String(lua.create_string(NO_MEMORY)?),
                    Value::Nil,
                ),
            })
        })?,
    )?;
    let d = dict.clone();
    t.set(
        "safe_set",
        lua.create_function(move |lua, (k, v, t): (String, Value, Option<f64>)| {
            let Some(v) = dict_value(v)? else {
                d.delete(&k);
                return Ok((Value::Boolean(true), Value::Nil));
            };
            Ok(match d.safe_set(&k, v, ttl(t)?) {
                Ok(()) => (Value::Boolean(true), Value::Nil),
                Err(NoMemory) => (Value::Nil, Value::String(lua.create_string(NO_MEMORY)?)),
            })
        })?,
    )?;
    let d = dict.clone();
    t.set(
        "incr",
        lua.create_function(
            move |_, (k, delta, t): (String, Option<f64>, Option<f64>)| {
                d.incr(&k, delta.unwrap_or(1.0), ttl(t)?)
                    .map_err(mlua::Error::runtime)
            },
        )?,
    )?;
    let d = dict;
    t.set(
        "delete",
        lua.create_function(move |_, k: String| {
            d.delete(&k);
            Ok(())
        })?,
    )?;
    Ok(t)
}

/// Where `ctx.http` may not connect: the admin listener (it can reload the gateway), unless
/// `[lua] http_allow_admin`.
pub(crate) struct AdminGuard {
    /// `[lua] http_allow_admin`.
    pub allow: bool,
    /// `[admin] listen` of the config version (`None`: no admin listener).
    pub configured: Option<SocketAddr>,
    /// The running admin listener's address, once bound: it wins over `configured` (a
    /// reload does not move the listener, and port 0 is only known once bound).
    pub bound: Arc<OnceLock<SocketAddr>>,
}

impl AdminGuard {
    /// Whether a connection to `to` may reach the admin listener: its port (any port while
    /// a configured port 0 is not bound yet) at its IP, or, when it listens on a loopback
    /// or unspecified address, at a loopback, unspecified or local interface address.
    pub(crate) fn refuses(&self, to: SocketAddr) -> bool {
        if self.allow {
            return false;
        }
        let Some(admin) = self.bound.get().copied().or(self.configured) else {
            return false;
        };
        if admin.port() != 0 && to.port() != admin.port() {
            return false;
        }
        let (ip, admin_ip) = (to.ip().to_canonical(), admin.ip().to_canonical());
        if ip == admin_ip {
            return true;
        }
        (admin_ip.is_loopback() || admin_ip.is_unspecified())
            && (ip.is_loopback() || ip.is_unspecified() || is_local(ip))
    }
}

/// Whether `ip` is an address of this host: a socket can be bound to it.
fn is_local(ip: IpAddr) -> bool {
    std::net::UdpSocket::bind((ip, 0)).is_ok()
}

/// Connect to the first address of `host:port` the guard allows (each address is checked
/// after it is resolved, and that very address is connected to: no second resolution).
async fn connect(
    host: &str,
    port: u16,
    authority: &str,
    guard: &AdminGuard,
) -> Result<tokio::net::TcpStream, String> {
    let addrs = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| format!("resolve {authority}: {e}"))?;
    let (mut refused, mut failed) = (false, None);
    for addr in addrs {
        if guard.refuses(addr) {
            refused = true;
            continue;
        }
        match tokio::net::TcpStream::connect(addr).await {
            Ok(stream) => return Ok(stream),
            Err(e) => failed = Some(e),
        }
    }
    Err(match failed {
        Some(e) => format!("connect {authority}: {e}"),
        None if refused => {
            format!("refused: {authority} is the admin listener (see [lua] http_allow_admin)")
        }
        None => format!("resolve {authority}: no addresses"),
    })
}

struct Call {
    method: Method,
    url: String,
    body: Bytes,
    headers: http::HeaderMap,
    timeout: Duration,
    max_body: usize,
    admin: Arc<AdminGuard>,
}

/// What every `ctx.http` call of a VM shares: the default timeout, the body cap, the guard.
#[derive(Clone)]
struct Shared {
    timeout: Duration,
    max_body: usize,
    admin: Arc<AdminGuard>,
}

fn call_from(
    method: Method,
    url: String,
    body: Option<mlua::LuaString>,
    opts: Option<Table>,
    s: &Shared,
) -> mlua::Result<Call> {
    let (mut timeout, mut headers) = (s.timeout, http::HeaderMap::new());
    if let Some(o) = opts {
        if let Some(t) = o.get::<Option<f64>>("timeout")? {
            if !(t.is_finite() && t > 0.0) {
                return Err(mlua::Error::runtime(
                    "timeout must be a number of seconds > 0",
                ));
            }
            timeout = Duration::from_secs_f64(t.min(3600.0));
        }
        headers = crate::ctx::from_table(o.get::<Option<Table>>("headers")?)?;
    }
    Ok(Call {
        method,
        url,
        body: body
            .map(|b| Bytes::from(b.as_bytes().to_vec()))
            .unwrap_or_default(),
        headers,
        timeout,
        max_body: s.max_body,
        admin: s.admin.clone(),
    })
}

async fn fetch(c: Call) -> Result<(u16, http::HeaderMap, Bytes), String> {
    let uri: http::Uri = c.url.parse().map_err(|e| format!("invalid URL: {e}"))?;
    if uri.scheme_str() != Some("http") {
        return Err("only http:// URLs are supported".into());
    }
    let authority = uri.authority().ok_or("the URL has no host")?.clone();
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    let port = authority.port_u16().unwrap_or(80);
    let stream = connect(host, port, authority.as_str(), &c.admin).await?;
    let _ = stream.set_nodelay(true);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake {authority}: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let pq = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let mut req = Request::new(Full::new(c.body));
    *req.method_mut() = c.method;
    *req.uri_mut() = pq.parse().map_err(|e| format!("invalid URL: {e}"))?;
    *req.headers_mut() = c.headers;
    if let Ok(h) = header::HeaderValue::from_str(authority.as_str()) {
        req.headers_mut().insert(header::HOST, h);
    }
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| format!("request to {authority}: {e}"))?;
    let (parts, body) = resp.into_parts();
    let body = Limited::new(body, c.max_body)
        .collect()
        .await
        .map_err(|e| format!("response body from {authority}: {e}"))?
        .to_bytes();
    Ok((parts.status.as_u16(), parts.headers, body))
}

async fn perform(lua: Lua, c: Call) -> mlua::Result<(Value, Value)> {
    let timeout = c.timeout;
    let r = match tokio::time::timeout(timeout, fetch(c)).await {
        Ok(r) => r,
        Err(_) => Err(format!("timed out after {timeout:?}")),
    };
    match r {
        Ok((status, headers, body)) => {
            let t = lua.create_table()?;
            t.set("status", status)?;
            t.set("body", lua.create_string(&body)?)?;
            let h = lua.create_table()?;
            for (k, v) in headers.iter() {
                if let Ok(v) = v.to_str() {
                    h.set(k.as_str(), v)?;
                }
            }
            t.set("headers", h)?;
            Ok((Value::Table(t), Value::Nil))
        }
        Err(e) => Ok((Value::Nil, Value::String(lua.create_string(e)?))),
    }
}

/// `http.get(url, opts)` and `http.post(url, body, opts)`.
pub(crate) fn http_table(lua: &Lua, settings: &Settings) -> mlua::Result<Table> {
    let s = Shared {
        timeout: settings.http_timeout,
        max_body: settings.http_max_body,
        admin: settings.admin.clone(),
    };
    let t = lua.create_table()?;
    let get = s.clone();
    t.set(
        "get",
        lua.create_async_function(move |lua, (url, opts): (String, Option<Table>)| {
            let c = call_from(Method::GET, url, None, opts, &get);
            async move { perform(lua, c?).await }
        })?,
    )?;
    t.set(
        "post",
        lua.create_async_function(
            move |lua, (url, body, opts): (String, Option<mlua::LuaString>, Option<Table>)| {
                let c = call_from(Method::POST, url, body, opts, &s);
                async move { perform(lua, c?).await }
            },
        )?,
    )?;
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(allow: bool, configured: &str, bound: Option<&str>) -> AdminGuard {
        let cell = OnceLock::new();
        if let Some(b) = bound {
            let _ = cell.set(b.parse().unwrap());
        }
        AdminGuard {
            allow,
            configured: Some(configured.parse().unwrap()),
            bound: Arc::new(cell),
        }
    }

    fn refuses(g: &AdminGuard, to: &str) -> bool {
        g.refuses(to.parse().unwrap())
    }

    #[test]
    fn the_admin_listener_is_refused_at_every_address_that_reaches_it() {
        let g = guard(false, "127.0.0.1:9901", None);
        assert!(refuses(&g, "127.0.0.1:9901"));
        assert!(refuses(&g, "127.0.0.2:9901"), "all of 127/8 is loopback");
        assert!(refuses(&g, "0.0.0.0:9901"));
        assert!(refuses(&g, "[::1]:9901"));
        assert!(refuses(&g, "[::ffff:127.0.0.1]:9901"));
        assert!(!refuses(&g, "127.0.0.1:9902"), "another port");
        assert!(!refuses(&g, "192.0.2.1:9901"), "not this host");
        assert!(!refuses(
            &guard(true, "127.0.0.1:9901", None),
            "127.0.0.1:9901"
        ));
        // An unspecified admin address listens on every local address.
        let g = guard(false, "0.0.0.0:9901", None);
        assert!(refuses(&g, "127.0.0.1:9901"));
        assert!(!refuses(&g, "192.0.2.1:9901"));
        // A specific non-loopback address: only that address.
        let g = guard(false, "192.0.2.7:9901", None);
        assert!(refuses(&g, "192.0.2.7:9901"));
        assert!(!refuses(&g, "127.0.0.1:9901"));
    }

    #[test]
    fn port_zero_refuses_every_port_until_the_listener_is_bound() {
        let g = guard(false, "127.0.0.1:0", None);
        assert!(refuses(&g, "127.0.0.1:80"));
        let g = guard(false, "127.0.0.1:0", Some("127.0.0.1:40001"));
        assert!(refuses(&g, "127.0.0.1:40001"));
        assert!(!refuses(&g, "127.0.0.1:80"));
        // The bound address wins over a reloaded config's.
        let g = guard(false, "127.0.0.1:9999", Some("127.0.0.1:40001"));
        assert!(refuses(&g, "127.0.0.1:40001"));
        assert!(!refuses(&g, "127.0.0.1:9999"));
    }
}
