//! Secrets kept out of what the gateway shows: the admin API's `/config` and log lines.

use crate::model::Config;

/// What a secret is replaced with.
pub const REDACTED: &str = "<redacted>";

impl Config {
    /// A copy with every secret replaced by [`REDACTED`]: the admin token, API keys, JWT
    /// shared secrets, the filter-debug secret and credentials in the Redis and JWKS URLs.
    /// Served by the admin `/config`.
    pub fn redacted(&self) -> Config {
        let mut c = self.clone();
        if c.admin.token.is_some() {
            c.admin.token = Some(REDACTED.into());
        }
        if c.filter_debug.secret.is_some() {
            c.filter_debug.secret = Some(REDACTED.into());
        }
        if let Some(url) = &c.redis.url {
            c.redis.url = Some(url_without_credentials(url));
        }
        redact_table(&mut c.traces.headers);
        for d in c.clusters.iter_mut().filter_map(|c| c.discovery.as_mut()) {
            if let Some(c) = d.consul.as_mut() {
                c.url = url_without_credentials(&c.url);
                if let Some(t) = c.token.as_mut().filter(|t| t.is_str()) {
                    *t = toml::Value::String(REDACTED.into());
                }
            }
            for u in d.eureka.iter_mut().flat_map(|e| e.urls.iter_mut()) {
                *u = url_without_credentials(u);
            }
            if let Some(t) = d.kubernetes.as_mut().and_then(|k| k.token.as_mut()) {
                if t.is_str() {
                    *t = toml::Value::String(REDACTED.into());
                }
            }
        }
        for t in c.lua.settings.values_mut() {
            redact_table(t);
        }
        for r in &mut c.routes {
            for t in r.lua_settings.values_mut() {
                redact_table(t);
            }
        }
        for f in &mut c.filters {
            redact_table(&mut f.params);
            for k in &mut f.keys {
                *k = REDACTED.into();
            }
            for k in &mut f.jwt_keys {
                if k.secret.is_some() {
                    k.secret = Some(REDACTED.into());
                }
            }
            if let Some(j) = &mut f.jwks {
                j.url = url_without_credentials(&j.url);
            }
        }
        c
    }
}

/// Filter parameters and Lua settings may hold secrets: their values are shown as
/// [`REDACTED`], except references to environment variables (`{ env = "NAME" }`), which
/// name a secret without holding it.
fn redact_table(t: &mut toml::Table) {
    for (_, v) in t.iter_mut() {
        if crate::filters::env_reference(v).is_none() {
            *v = toml::Value::String(REDACTED.into());
        }
    }
}

/// `scheme://user:password@host/...` → `scheme://***@host/...`.
pub fn url_without_credentials(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://***{}", &rest[at..]),
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_leave_urls() {
        assert_eq!(
            url_without_credentials("redis://user:secret@10.0.0.2:6379/0"),
            "redis://***@10.0.0.2:6379/0"
        );
        assert_eq!(
            url_without_credentials("redis://10.0.0.2:6379"),
            "redis://10.0.0.2:6379"
        );
        assert_eq!(
            url_without_credentials("redis+unix:///run/redis.sock"),
            "redis+unix:///run/redis.sock"
        );
    }

    #[test]
    fn secrets_are_redacted() {
        let text = r#"
[admin]
token = "admin-token-0123456789"
[filter_debug]
secret = "debug-secret-0123456789"
[redis]
url = "redis://u:p4ss@127.0.0.1:6379"
[[listeners]]
name = "main"
address = "127.0.0.1:0"
[[clusters]]
name = "c"
servers = [{ address = "127.0.0.1:9" }]
[[routes]]
name = "r"
cluster = "c"
[[filters]]
name = "keys"
type = "api_key"
stage = "pre"
keys = ["k1", "k2"]
[[filters]]
name = "jwt"
type = "jwt"
stage = "pre"
jwt_keys = [{ alg = "HS256", secret = "hmac-secret-0123456789" }]
"#;
        let cfg = crate::load_str(text, "t.toml").expect("valid config");
        let shown = serde_json::to_string(&cfg.redacted()).expect("serializes");
        for secret in [
            "admin-token-0123456789",
            "debug-secret-0123456789",
            "p4ss",
            "k1",
            "k2",
            "hmac-secret-0123456789",
        ] {
            assert!(!shown.contains(secret), "{secret} leaked: {shown}");
        }
        assert!(shown.contains(REDACTED));
    }
}
