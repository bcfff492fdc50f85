//! The `jwt` built-in: verify a bearer token against static keys (`jwt_keys`: HS256, RS256,
//! ES256, EdDSA; JWK components or PEM) and a key set fetched from a URL (`jwks`: RSA, EC
//! and OKP keys, refreshed in the background, see [`jwks`]); check `exp`, `nbf` (with
//! `leeway`), `iss` and `aud`; copy claims into request headers.
//!
//! Parsing and claim checks are the `jsonwebtoken` crate's; its signatures are checked with
//! `ring` ([`ring_provider`]). A token's `alg` must fit the key (no `none`, no HMAC with a
//! public key). Everything here runs synchronously on the request: the key sets are read
//! lock-free and an unknown `kid` only asks the JWKS thread for an early fetch.

#[cfg(test)]
mod cost_tests;
mod jwks;
mod keys;
mod ring_provider;

use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, StatusCode};
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, Validation};
use std::sync::Arc;

use super::builtin::deny;
use super::{done, Filter, FilterCtx, FilterFuture, Needs};
use crate::metrics::Metrics;
use jwks::Jwks;
use keymaster_config::FilterConfig;
use keys::Key;

type Claims = serde_json::Map<String, serde_json::Value>;

/// Seconds of clock skew allowed on `exp` and `nbf` unless `leeway` says otherwise.
const LEEWAY: u64 = 30;

/// Every algorithm a token may name (each needs a key it fits).
const ALGORITHMS: [Algorithm; 12] = [
    Algorithm::HS256,
    Algorithm::HS384,
    Algorithm::HS512,
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];

pub(super) struct Jwt {
    header: HeaderName,
    keys: Vec<Key>,
    jwks: Option<Arc<Jwks>>,
    /// The claim checks, one per algorithm (the crate wants the token's in the list).
    validations: Vec<(Algorithm, Validation)>,
    claims: Vec<(String, HeaderName)>,
}

impl Jwt {
    pub(super) fn compile(f: &FilterConfig, metrics: &Metrics) -> Result<Jwt, String> {
        ring_provider::install();
        let keys = f
            .jwt_keys
            .iter()
            .map(keys::from_config)
            .collect::<Result<_, _>>()?;
        let jwks = f
            .jwks
            .as_ref()
            .map(|c| Jwks::get(&f.name, c, metrics))
            .transpose()?;
        let leeway = f.leeway.map_or(LEEWAY, |l| l.get().as_secs());
        let validations = ALGORITHMS
            .iter()
            .map(|a| (*a, validation(*a, f, leeway)))
            .collect();
        Ok(Jwt {
            header: name(f.header.as_deref().unwrap_or("authorization"))?,
            keys,
            jwks,
            validations,
            claims: f
                .claims_to_headers
                .iter()
                .map(|(c, h)| Ok((c.clone(), name(h)?)))
                .collect::<Result<_, String>>()?,
        })
    }

    /// The verified claims, or why not.
    fn verify(&self, token: &str) -> Result<Claims, &'static str> {
        let head = jsonwebtoken::decode_header(token).map_err(|_| bad_header(token))?;
        let Some((_, validation)) = self.validations.iter().find(|(a, _)| *a == head.alg) else {
            return Err("unsupported alg");
        };
        let kid = head.kid.as_deref();
        let remote = self.jwks.as_ref().map(|j| j.keys());
        let all = || self.keys.iter().chain(remote.iter().flat_map(|r| r.iter()));
        for key in all().filter(|k| k.accepts(head.alg, kid)) {
            match jsonwebtoken::decode::<Claims>(token, &key.key, validation) {
                Ok(data) => return Ok(data.claims),
                Err(e) if *e.kind() == ErrorKind::InvalidSignature => continue,
                Err(e) => return Err(why(e.kind())),
            }
        }
        match (&self.jwks, kid) {
            (Some(j), Some(kid)) if !all().any(|k| k.kid.as_deref() == Some(kid)) => {
                j.request_refresh();
                Err("unknown kid")
            }
            _ => Err("bad signature"),
        }
    }
}

fn name(h: &str) -> Result<HeaderName, String> {
    HeaderName::from_bytes(h.as_bytes()).map_err(|e| e.to_string())
}

/// The checks for tokens signed with `alg`: `exp` and `nbf` when present (with `leeway`),
/// `iss` and `aud` required when configured.
fn validation(alg: Algorithm, f: &FilterConfig, leeway: u64) -> Validation {
    let mut v = Validation::new(alg);
    v.leeway = leeway;
    v.validate_exp = true;
    v.validate_nbf = true;
    v.required_spec_claims.clear();
    v.validate_aud = f.audience.is_some();
    if let Some(aud) = &f.audience {
        v.set_audience(&[aud]);
        v.required_spec_claims.insert("aud".into());
    }
    if let Some(iss) = &f.issuer {
        v.set_issuer(&[iss]);
        v.required_spec_claims.insert("iss".into());
    }
    v
}

/// A header the crate could not read: an algorithm it does not know, or no JWT at all.
fn bad_header(token: &str) -> &'static str {
    use base64::Engine;
    let head = token.split('.').next().unwrap_or("");
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(head)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
    match json {
        Some(h) if token.split('.').count() == 3 && h.get("alg").is_some() => "unsupported alg",
        _ => "malformed token",
    }
}

/// The `error_description` of a failed check.
fn why(kind: &ErrorKind) -> &'static str {
    match kind {
        ErrorKind::ExpiredSignature => "expired",
        ErrorKind::ImmatureSignature => "not yet valid",
        ErrorKind::InvalidIssuer => "wrong issuer",
        ErrorKind::InvalidAudience => "wrong audience",
        ErrorKind::MissingRequiredClaim(c) if c == "iss" => "wrong issuer",
        ErrorKind::MissingRequiredClaim(c) if c == "aud" => "wrong audience",
        ErrorKind::InvalidClaimFormat(_) => "malformed claims",
        ErrorKind::InvalidAlgorithm => "bad signature",
        _ => "malformed token",
    }
}

impl Filter for Jwt {
    fn run<'a>(&'a self, ctx: &'a mut FilterCtx<'_>) -> FilterFuture<'a> {
        // Claim headers come only from a verified token, never from the client.
        for (_, h) in &self.claims {
            ctx.request_headers_mut().remove(h);
        }
        let token = ctx
            .request_headers()
            .get(&self.header)
            .and_then(|v| v.to_str().ok())
            .map(|v| match v.get(..7) {
                Some(p) if p.eq_ignore_ascii_case("bearer ") => v[7..].trim(),
                _ => v.trim(),
            });
        let result = match token {
            Some(t) if !t.is_empty() => self.verify(t),
            _ => Err("missing token"),
        };
        match result {
            Ok(claims) => self.copy_claims(ctx, &claims),
            Err(why) => {
                let mut h = HeaderMap::new();
                let challenge =
                    format!("Bearer error=\"invalid_token\", error_description=\"{why}\"");
                if let Ok(v) = HeaderValue::from_str(&challenge) {
                    h.insert(header::WWW_AUTHENTICATE, v);
                }
                deny(ctx, StatusCode::UNAUTHORIZED, h);
            }
        }
        done(Ok(()))
    }

    fn needs(&self) -> Needs {
        Needs::DEFAULT | Needs::SYNCHRONOUS
    }
}

impl Jwt {
    fn copy_claims(&self, ctx: &mut FilterCtx<'_>, claims: &Claims) {
        for (claim, h) in &self.claims {
            let text = match claims.get(claim) {
                Some(serde_json::Value::String(s)) => s.clone(),
                Some(serde_json::Value::Null) | None => continue,
                Some(v) => v.to_string(),
            };
            if let Ok(v) = HeaderValue::from_str(&text) {
                ctx.request_headers_mut().insert(h.clone(), v);
            }
        }
    }
}
