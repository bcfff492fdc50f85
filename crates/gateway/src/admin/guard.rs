//! Who may ask the admin listener what. Every request passes [`Guard::check`] before it is
//! routed; a refusal names what was missing and becomes a response in `admin::respond`.
//!
//! - **Browsers of other sites.** A request with an `Origin` header (a browser's) must come
//!   from the admin's own origin, `http://<Host>`, and its Host must be an IP address or
//!   `localhost` (a page that rebinds its own DNS name to 127.0.0.1 shares that name with
//!   the admin, so a DNS name is not trusted from browsers). Otherwise 403, on every
//!   endpoint. No response carries `Access-Control-Allow-*`, so a CORS preflight never
//!   succeeds.
//! - **State changes.** `POST /reload` also needs `Content-Type: application/json` or an
//!   [`ADMIN_HEADER`] header: neither can be sent cross-origin without a preflight, so a web
//!   page cannot forge the request (403 otherwise).
//! - **Secrets.** With `[admin] token` (or `token_env`), `GET /config` and `POST /reload`
//!   need `Authorization: Bearer <token>` (401 with `WWW-Authenticate: Bearer` otherwise).
//!   `/metrics`, `/healthz`, `/ready` and `/health/clusters` stay open for probes and
//!   scrapers: they change nothing and show no secrets.

use http::{header, HeaderMap, Method, StatusCode};
use ring::hmac;
use std::net::IpAddr;

/// The custom header that marks a request to a mutating endpoint as not cross-site.
pub(crate) const ADMIN_HEADER: &str = "x-keymaster-admin";

/// What an endpoint requires beyond the same-origin rule every request passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Probes and scrapers: nothing more.
    Open,
    /// Shows secrets' surroundings (`/config`): the token, when one is set.
    Token,
    /// Changes state (`/reload`, `/healthcheck/fail`, `/healthcheck/ok`): a non-simple
    /// request, and the token when one is set.
    Mutating,
}

impl Access {
    /// The access an admin endpoint needs.
    pub(crate) fn of(method: &Method, path: &str) -> Access {
        match (method, path) {
            (&Method::POST, "/reload" | "/healthcheck/fail" | "/healthcheck/ok") => {
                Access::Mutating
            }
            (&Method::GET, "/config") => Access::Token,
            _ => Access::Open,
        }
    }
}

/// A request the guard turned away: its status, its metric label and what was missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refused {
    pub(crate) status: StatusCode,
    /// `reason` label of `keymaster_admin_requests_refused_total`.
    pub(crate) reason: &'static str,
    pub(crate) message: &'static str,
}

const CROSS_ORIGIN: Refused = Refused {
    status: StatusCode::FORBIDDEN,
    reason: "cross_origin",
    message: "cross-origin request refused: the Origin must be http://<Host>, with the admin named by IP address or localhost",
};

const SIMPLE_REQUEST: Refused = Refused {
    status: StatusCode::FORBIDDEN,
    reason: "simple_request",
    message: "POST needs Content-Type: application/json or an X-Keymaster-Admin header (cross-site request guard)",
};

const UNAUTHORIZED: Refused = Refused {
    status: StatusCode::UNAUTHORIZED,
    reason: "unauthorized",
    message: "this endpoint needs Authorization: Bearer <the [admin] token>",
};

/// The admin listener's request checks, built once at start.
pub(crate) struct Guard {
    /// The token's HMAC tag, under `key`: comparing tags is constant-time and does not
    /// depend on the tokens' lengths.
    token: Option<hmac::Tag>,
    key: hmac::Key,
}

impl Guard {
    /// A guard requiring `token` (when set) on [`Access::Token`] and [`Access::Mutating`].
    pub(crate) fn new(token: Option<&str>) -> Guard {
        // The key need not be secret: `hmac::verify` compares in constant time, the tag only
        // brings both tokens to one length.
        let key = hmac::Key::new(hmac::HMAC_SHA256, b"keymaster admin token");
        Guard {
            token: token.map(|t| hmac::sign(&key, t.as_bytes())),
            key,
        }
    }

    /// Whether a request with these headers may reach an endpoint needing `access`.
    pub(crate) fn check(&self, headers: &HeaderMap, access: Access) -> Result<(), Refused> {
        same_origin(headers)?;
        if access == Access::Mutating {
            not_simple(headers)?;
        }
        if access != Access::Open {
            self.bearer(headers)?;
        }
        Ok(())
    }

    /// The configured token, if any, in `Authorization: Bearer <token>`.
    fn bearer(&self, headers: &HeaderMap) -> Result<(), Refused> {
        let Some(tag) = &self.token else {
            return Ok(());
        };
        let given = headers
            .get(header::AUTHORIZATION)
            .map(|v| v.as_bytes())
            .filter(|v| v.len() > 7 && v[..7].eq_ignore_ascii_case(b"bearer "))
            .map(|v| &v[7..]);
        match given {
            Some(token) if hmac::verify(&self.key, token, tag.as_ref()).is_ok() => Ok(()),
            _ => Err(UNAUTHORIZED),
        }
    }
}

/// No `Origin` (not a browser), or the admin's own, reached by address.
fn same_origin(headers: &HeaderMap) -> Result<(), Refused> {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let own = match (origin.to_str(), host) {
        (Ok(origin), Some(host)) => {
            origin
                .strip_prefix("http://")
                .is_some_and(|o| o.eq_ignore_ascii_case(host))
                && named_by_address(host)
        }
        _ => false,
    };
    if own {
        Ok(())
    } else {
        Err(CROSS_ORIGIN)
    }
}

/// A Host (`name[:port]`) that names an IP address or `localhost`, not a DNS name.
fn named_by_address(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.split(':').next().unwrap_or(""),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<IpAddr>().is_ok()
}

/// A request a browser cannot send cross-origin without a preflight: JSON, or the custom
/// header.
fn not_simple(headers: &HeaderMap) -> Result<(), Refused> {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"));
    if json || headers.contains_key(ADMIN_HEADER) {
        Ok(())
    } else {
        Err(SIMPLE_REQUEST)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, http::HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn origins() {
        let g = Guard::new(None);
        let ok = |pairs: &[(&'static str, &'static str)]| g.check(&headers(pairs), Access::Open);
        assert_eq!(ok(&[("host", "127.0.0.1:9901")]), Ok(()));
        assert_eq!(
            ok(&[
                ("host", "127.0.0.1:9901"),
                ("origin", "http://127.0.0.1:9901")
            ]),
            Ok(())
        );
        assert_eq!(
            ok(&[("host", "[::1]:9901"), ("origin", "http://[::1]:9901")]),
            Ok(())
        );
        assert_eq!(
            ok(&[
                ("host", "LOCALHOST:9901"),
                ("origin", "http://localhost:9901")
            ]),
            Ok(())
        );
        for (host, origin) in [
            ("127.0.0.1:9901", "http://evil.example"),
            ("127.0.0.1:9901", "null"),
            ("127.0.0.1:9901", "https://127.0.0.1:9901"),
            ("127.0.0.1:9901", "http://127.0.0.1:9902"),
            // DNS rebinding: the page's name now points at the admin.
            ("evil.example:9901", "http://evil.example:9901"),
        ] {
            assert_eq!(
                ok(&[("host", host), ("origin", origin)]),
                Err(CROSS_ORIGIN),
                "{host} {origin}"
            );
        }
        assert_eq!(
            ok(&[("origin", "http://127.0.0.1:9901")]),
            Err(CROSS_ORIGIN)
        );
    }

    #[test]
    fn mutating_requests_are_not_simple() {
        let g = Guard::new(None);
        let post =
            |pairs: &[(&'static str, &'static str)]| g.check(&headers(pairs), Access::Mutating);
        assert_eq!(post(&[]), Err(SIMPLE_REQUEST));
        assert_eq!(post(&[("content-type", "text/plain")]), Err(SIMPLE_REQUEST));
        assert_eq!(
            post(&[("content-type", "application/x-www-form-urlencoded")]),
            Err(SIMPLE_REQUEST)
        );
        assert_eq!(post(&[("content-type", "application/json")]), Ok(()));
        assert_eq!(
            post(&[("content-type", "Application/JSON; charset=utf-8")]),
            Ok(())
        );
        assert_eq!(post(&[("x-keymaster-admin", "1")]), Ok(()));
        // Open endpoints do not need it.
        assert_eq!(g.check(&headers(&[]), Access::Open), Ok(()));
    }

    #[test]
    fn tokens() {
        let g = Guard::new(Some("0123456789abcdef"));
        let get = |pairs: &[(&'static str, &'static str)]| g.check(&headers(pairs), Access::Token);
        assert_eq!(get(&[]), Err(UNAUTHORIZED));
        assert_eq!(
            get(&[("authorization", "Bearer 0123456789abcdeX")]),
            Err(UNAUTHORIZED)
        );
        assert_eq!(
            get(&[("authorization", "Bearer 0123456789abcde")]),
            Err(UNAUTHORIZED)
        );
        assert_eq!(
            get(&[("authorization", "Basic 0123456789abcdef")]),
            Err(UNAUTHORIZED)
        );
        assert_eq!(get(&[("authorization", "Bearer ")]), Err(UNAUTHORIZED));
        assert_eq!(get(&[("authorization", "Bearer 0123456789abcdef")]), Ok(()));
        assert_eq!(get(&[("authorization", "bearer 0123456789abcdef")]), Ok(()));
        assert_eq!(g.check(&headers(&[]), Access::Open), Ok(()));
        // Without a token, nothing is asked for.
        assert_eq!(Guard::new(None).check(&headers(&[]), Access::Token), Ok(()));
    }

    #[test]
    fn endpoints() {
        assert_eq!(Access::of(&Method::POST, "/reload"), Access::Mutating);
        assert_eq!(Access::of(&Method::GET, "/config"), Access::Token);
        for (m, p) in [
            (Method::GET, "/metrics"),
            (Method::GET, "/healthz"),
            (Method::GET, "/ready"),
            (Method::GET, "/health/clusters"),
            (Method::GET, "/reload"),
        ] {
            assert_eq!(Access::of(&m, p), Access::Open, "{m} {p}");
        }
    }
}
