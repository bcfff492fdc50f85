//! Two native filters, written against `keymaster-filter` alone:
//!
//! - [`ApiAuth`] (`pre`): the request must carry one of the configured keys in a header, or
//!   it is answered 401 there; the caller's name goes into the request's typed extensions.
//! - [`Stamp`] (`post`): stamps the response with the caller's name (read back from the
//!   extensions) and a fixed value.
//!
//! Both take their parameters from the config: a `[[filters]]` table with `type = "native"`
//! names the type, its `params` table is parsed into [`ApiAuthParams`] or [`StampParams`],
//! and `{ env = "NAME" }` in it reads an environment variable. See `gateway.toml` and
//! `examples/gateway.rs` beside this crate.

use keymaster_filter::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use keymaster_filter::{done, Filter, FilterCtx, FilterFuture, Needs, Params};
use serde::Deserialize;
use std::collections::BTreeMap;

/// Who the caller is, as [`ApiAuth`] found: a typed extension later filters read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller(pub String);

/// `params` of an `api_auth` filter.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiAuthParams {
    /// The request header carrying the key.
    #[serde(default = "default_header")]
    pub header: String,
    /// Caller name → that caller's key (`{ env = "NAME" }` keeps it out of the file).
    pub callers: BTreeMap<String, String>,
}

fn default_header() -> String {
    "x-api-key".into()
}

/// Refuses requests without a known key (401), and tells later filters who called.
pub struct ApiAuth {
    header: HeaderName,
    /// Key → caller name.
    keys: BTreeMap<String, String>,
}

impl ApiAuth {
    /// Built from a `[[filters]]` table's `params`; a bad header name or an empty key set
    /// rejects the config.
    pub fn from_params(p: &Params) -> Result<ApiAuth, String> {
        let p: ApiAuthParams = p.parse()?;
        if p.callers.is_empty() {
            return Err("callers: expected at least one caller and key".into());
        }
        let header = HeaderName::from_bytes(p.header.as_bytes())
            .map_err(|_| format!("header: {:?} is not a header name", p.header))?;
        let keys = p
            .callers
            .into_iter()
            .map(|(name, key)| (key, name))
            .collect();
        Ok(ApiAuth { header, keys })
    }
}

impl Filter for ApiAuth {
    fn run<'a>(&'a self, ctx: &'a mut FilterCtx<'_>) -> FilterFuture<'a> {
        let caller = ctx
            .request_header(self.header.as_str())
            .and_then(|k| std::str::from_utf8(k).ok())
            .and_then(|k| self.keys.get(k))
            .cloned();
        match caller {
            Some(name) => {
                ctx.extensions_mut().insert(Caller(name));
            }
            None => {
                let mut headers = HeaderMap::new();
                headers.insert("www-authenticate", HeaderValue::from_static("ApiKey"));
                ctx.respond(
                    StatusCode::UNAUTHORIZED,
                    headers,
                    "a valid API key is required\n",
                );
            }
        }
        done(Ok(()))
    }

    fn needs(&self) -> Needs {
        Needs::SYNCHRONOUS | Needs::REQUEST_HEADERS
    }
}

/// `params` of a `stamp` filter.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StampParams {
    /// The value of `x-stamp` on every response.
    pub value: String,
}

/// Adds `x-stamp: <value>` and, for an authenticated caller, `x-caller: <name>`.
pub struct Stamp {
    value: HeaderValue,
}

impl Stamp {
    pub fn from_params(p: &Params) -> Result<Stamp, String> {
        let p: StampParams = p.parse()?;
        let value = HeaderValue::from_str(&p.value)
            .map_err(|_| format!("value: {:?} is not a header value", p.value))?;
        Ok(Stamp { value })
    }
}

impl Filter for Stamp {
    fn run<'a>(&'a self, ctx: &'a mut FilterCtx<'_>) -> FilterFuture<'a> {
        ctx.append_response_header(HeaderName::from_static("x-stamp"), self.value.clone());
        let caller = ctx.extension::<Caller>().map(|c| c.0.clone());
        if let Some(v) = caller.and_then(|c| HeaderValue::from_str(&c).ok()) {
            ctx.append_response_header(HeaderName::from_static("x-caller"), v);
        }
        done(Ok(()))
    }

    fn needs(&self) -> Needs {
        Needs::SYNCHRONOUS
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keymaster_filter::http::Method;
    use keymaster_filter::TestRequest;

    fn params(text: &str) -> Params {
        Params::resolve(&text.parse().expect("toml")).expect("params")
    }

    fn auth() -> ApiAuth {
        ApiAuth::from_params(&params("callers = { alice = \"k1\" }")).expect("api_auth")
    }

    fn request(key: Option<&str>) -> TestRequest {
        let mut headers = HeaderMap::new();
        if let Some(k) = key {
            headers.insert("x-api-key", HeaderValue::from_str(k).expect("value"));
        }
        TestRequest::new(
            Method::GET,
            "/orders",
            headers,
            ([10, 0, 0, 1], 4000).into(),
        )
    }

    #[test]
    fn a_known_key_passes_and_names_the_caller() {
        let mut req = request(Some("k1"));
        assert!(req.run_pre(&auth()).expect("runs"));
        assert_eq!(req.answered(), None);
        assert_eq!(
            req.ctx().extension::<Caller>(),
            Some(&Caller("alice".into()))
        );
    }

    #[test]
    fn a_missing_or_unknown_key_is_answered_401() {
        for key in [None, Some("nope")] {
            let mut req = request(key);
            assert!(req.run_pre(&auth()).expect("runs"));
            assert!(req.ctx().extension::<Caller>().is_none());
            assert_eq!(req.answered(), Some(StatusCode::UNAUTHORIZED), "{key:?}");
        }
    }

    #[test]
    fn the_stamp_names_the_caller_that_auth_found() {
        let stamp = Stamp::from_params(&params("value = \"v1\"")).expect("stamp");
        let mut req = request(Some("k1")).with_response(StatusCode::OK, HeaderMap::new());
        req.run_pre(&auth()).expect("auth runs");
        req.run_post(&stamp).expect("stamp runs");
        let (status, headers) = req.response();
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers["x-stamp"], "v1");
        assert_eq!(headers["x-caller"], "alice");
        // No caller (auth did not run): the stamp alone.
        let mut req = request(None);
        req.run_post(&stamp).expect("stamp runs");
        assert!(!req.response().1.contains_key("x-caller"));
    }

    #[test]
    fn parameters_are_checked() {
        let e = ApiAuth::from_params(&params("callers = {}"))
            .err()
            .expect("refused");
        assert!(e.contains("at least one caller"), "{e}");
        let e = ApiAuth::from_params(&params("callers = { a = \"b\" }\nheder = \"x\""))
            .err()
            .expect("refused");
        assert!(e.contains("heder"), "{e}");
        let e = ApiAuth::from_params(&params("callers = { a = \"b\" }\nheader = \"a b\""))
            .err()
            .expect("refused");
        assert!(e.contains("not a header name"), "{e}");
        assert!(Stamp::from_params(&params("value = \"v1\"")).is_ok());
        assert!(Stamp::from_params(&params("value = \"a\\nb\"")).is_err());
    }
}
