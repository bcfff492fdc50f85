//! Validation of the `jwt` filter's keys: static keys (`jwt_keys`), the fetched key set
//! (`jwks`) and `leeway`, each problem located by its key path.

use crate::locate::KeyPath;
use crate::model::{FilterConfig, JwksConfig, JwtAlg, JwtKey};
use crate::validate::{check_header_name, Problems};
use base64::Engine;
use std::time::Duration as Std;

/// The largest `leeway`, `refresh` and `min_refresh` accepted.
const MAX_LEEWAY: Std = Std::from_secs(3600);
const MAX_JWKS_SIZE: u64 = 16 * 1024 * 1024;

/// A `type = "jwt"` table's own keys.
pub(crate) fn check_jwt(f: &FilterConfig, at: &KeyPath, p: &mut Problems) {
    if let Some(h) = &f.header {
        check_header_name(h, at.key("header"), p);
    }
    if f.jwt_keys.is_empty() && f.jwks.is_none() {
        p.push(
            at.key("type"),
            "a jwt filter needs jwt_keys or jwks; expected e.g. jwks = { url = \"https://login.example.com/.well-known/jwks.json\" }",
        );
    }
    for (j, k) in f.jwt_keys.iter().enumerate() {
        check_jwt_key(k, &at.key("jwt_keys").index(j), p);
    }
    if let Some(j) = &f.jwks {
        check_jwks(j, &at.key("jwks"), p);
    }
    if f.leeway.is_some_and(|l| l.get() > MAX_LEEWAY) {
        p.push(
            at.key("leeway"),
            "too long; expected at most \"1h\", like \"30s\"",
        );
    }
    for (claim, h) in &f.claims_to_headers {
        check_header_name(h, at.key("claims_to_headers").key(claim), p);
    }
}

/// One `jwt_keys` entry: the material its `alg` needs, and nothing else.
fn check_jwt_key(k: &JwtKey, at: &KeyPath, p: &mut Problems) {
    let alg = k.alg.as_str();
    let only = |key: &str, set: bool, users: &str, p: &mut Problems| {
        if set {
            p.push(at.key(key), format!("{key} is only used by {users} keys"));
        }
    };
    match k.alg {
        JwtAlg::HS256 => {
            match &k.secret {
                None => p.push(at.clone(), "an HS256 key needs secret"),
                Some(s) if s.len() < 16 => p.push(
                    at.key("secret"),
                    "too short for HS256; expected at least 16 bytes (32 recommended)",
                ),
                Some(_) => {}
            }
            only("n", k.n.is_some(), "RS256", p);
            only("e", k.e.is_some(), "RS256", p);
            only("pem", k.pem.is_some(), "RS256, ES256 and EdDSA", p);
        }
        JwtAlg::RS256 if k.pem.is_none() => {
            check_b64(&k.n, "n", at, p);
            check_b64(&k.e, "e", at, p);
            only("secret", k.secret.is_some(), "HS256", p);
        }
        JwtAlg::RS256 | JwtAlg::ES256 | JwtAlg::EdDSA => {
            match &k.pem {
                None => p.push(
                    at.clone(),
                    format!("an {alg} key needs pem; expected pem = \"-----BEGIN PUBLIC KEY-----\\n...\""),
                ),
                Some(pem) => check_pem(pem, k.alg, &at.key("pem"), p),
            }
            only("secret", k.secret.is_some(), "HS256", p);
            for (key, set) in [("n", k.n.is_some()), ("e", k.e.is_some())] {
                if !set {
                    continue;
                }
                let why = if k.alg == JwtAlg::RS256 {
                    format!("{key} is not used with pem; expected either n and e, or pem")
                } else {
                    format!("{key} is only used by RS256 keys")
                };
                p.push(at.key(key), why);
            }
        }
    }
}

/// A JWK component: present and base64url.
fn check_b64(v: &Option<String>, key: &str, at: &KeyPath, p: &mut Problems) {
    match v {
        None => p.push(
            at.clone(),
            format!("an RS256 key needs {key} (or pem); expected the JWK's base64url {key}"),
        ),
        Some(s) => {
            if base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(s.trim_end_matches('='))
                .map(|b| b.is_empty())
                .unwrap_or(true)
            {
                p.push(
                    at.key(key),
                    format!("{key} is not base64url; expected the JWK's {key}"),
                );
            }
        }
    }
}

/// A PEM public key of the kind `alg` needs (parsed here, so a bad key is located).
fn check_pem(pem: &str, alg: JwtAlg, at: &KeyPath, p: &mut Problems) {
    use jsonwebtoken::DecodingKey;
    let parsed = match alg {
        JwtAlg::RS256 => DecodingKey::from_rsa_pem(pem.as_bytes()),
        JwtAlg::ES256 => DecodingKey::from_ec_pem(pem.as_bytes()),
        JwtAlg::EdDSA => DecodingKey::from_ed_pem(pem.as_bytes()),
        JwtAlg::HS256 => return,
    };
    if let Err(e) = parsed {
        let kind = match alg {
            JwtAlg::RS256 => "an RSA",
            JwtAlg::ES256 => "a P-256 EC",
            _ => "an Ed25519",
        };
        p.push(
            at.clone(),
            format!(
                "not {kind} public key in PEM ({e}); expected \"-----BEGIN PUBLIC KEY-----\\n...\\n-----END PUBLIC KEY-----\""
            ),
        );
    }
}

/// `jwks`: a usable URL, sane intervals and bounds.
fn check_jwks(j: &JwksConfig, at: &KeyPath, p: &mut Problems) {
    let uri = j.url.parse::<http::Uri>().ok();
    let scheme = uri.as_ref().and_then(|u| u.scheme_str());
    let host = uri.as_ref().and_then(|u| u.host()).unwrap_or("");
    if !matches!(scheme, Some("http" | "https")) || host.is_empty() {
        p.push(
            at.key("url"),
            format!(
                "{:?} is not an http or https URL; expected e.g. \"https://login.example.com/.well-known/jwks.json\"",
                j.url
            ),
        );
    }
    if j.refresh.get() < Std::from_secs(1) || j.refresh.get() > 24 * MAX_LEEWAY {
        p.push(
            at.key("refresh"),
            "must be between \"1s\" and \"24h\"; expected a duration like \"5m\"",
        );
    }
    if j.min_refresh.get() < Std::from_millis(100) || j.min_refresh.get() > j.refresh.get() {
        p.push(
            at.key("min_refresh"),
            "must be between \"100ms\" and refresh; expected a duration like \"30s\"",
        );
    }
    if j.timeout.get().is_zero() || j.timeout.get() > Std::from_secs(60) {
        p.push(
            at.key("timeout"),
            "must be between \"1ms\" and \"60s\"; expected a duration like \"5s\"",
        );
    }
    if j.max_size.0 == 0 || j.max_size.0 > MAX_JWKS_SIZE {
        p.push(
            at.key("max_size"),
            "must be between 1 byte and \"16MiB\"; expected a size like \"256KiB\"",
        );
    }
    match &j.ca {
        Some(ca) if ca.trim().is_empty() => {
            p.push(at.key("ca"), "must not be empty; expected a PEM file path")
        }
        Some(_) if scheme == Some("http") => p.push(
            at.key("ca"),
            "ca is only used with an https url; expected an https:// url or no ca",
        ),
        _ => {}
    }
}
