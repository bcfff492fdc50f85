//! The `jwt` built-in: verify a bearer token (HS256 or RS256), check `exp`, `nbf`, `iss`
//! and `aud`, and copy claims into request headers. Keys rotate by reloading the config.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, StatusCode};
use ring::{hmac, signature};
use std::time::{SystemTime, UNIX_EPOCH};

use super::builtin::deny;
use super::{done, Filter, FilterCtx, FilterFuture, Needs};
use keymaster_config::{FilterConfig, JwtAlg};

/// Seconds of clock skew allowed on `exp` and `nbf`.
const LEEWAY: u64 = 30;

enum Key {
    Hs256(hmac::Key),
    Rs256 { n: Vec<u8>, e: Vec<u8> },
}

struct NamedKey {
    kid: Option<String>,
    key: Key,
}

pub(super) struct Jwt {
    header: HeaderName,
    keys: Vec<NamedKey>,
    issuer: Option<String>,
    audience: Option<String>,
    claims: Vec<(String, HeaderName)>,
}

fn b64(s: &str) -> Result<Vec<u8>, String> {
    URL_SAFE_NO_PAD
        .decode(s.trim_end_matches('='))
        .map_err(|e| e.to_string())
}

impl Jwt {
    pub(super) fn compile(f: &FilterConfig) -> Result<Jwt, String> {
        let keys = f
            .jwt_keys
            .iter()
            .map(|k| {
                let key = match k.alg {
                    JwtAlg::HS256 => Key::Hs256(hmac::Key::new(
                        hmac::HMAC_SHA256,
                        k.secret.as_deref().unwrap_or("").as_bytes(),
                    )),
                    JwtAlg::RS256 => Key::Rs256 {
                        n: b64(k.n.as_deref().unwrap_or(""))?,
                        e: b64(k.e.as_deref().unwrap_or(""))?,
                    },
                };
                Ok(NamedKey {
                    kid: k.kid.clone(),
                    key,
                })
            })
            .collect::<Result<_, String>>()?;
        Ok(Jwt {
            header: HeaderName::from_bytes(
                f.header.as_deref().unwrap_or("authorization").as_bytes(),
            )
            .map_err(|e| e.to_string())?,
            keys,
            issuer: f.issuer.clone(),
            audience: f.audience.clone(),
            claims: f
                .claims_to_headers
                .iter()
                .map(|(c, h)| {
                    Ok((
                        c.clone(),
                        HeaderName::from_bytes(h.as_bytes()).map_err(|e| e.to_string())?,
                    ))
                })
                .collect::<Result<_, String>>()?,
        })
    }

    /// The verified claims, or why not.
    fn verify(
        &self,
        token: &str,
        now: u64,
    ) -> Result<serde_json::Map<String, serde_json::Value>, &'static str> {
        let mut parts = token.split('.');
        let (Some(h), Some(p), Some(sig), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err("malformed token");
        };
        let head: serde_json::Value =
            serde_json::from_slice(&b64(h).map_err(|_| "malformed header")?)
                .map_err(|_| "malformed header")?;
        let alg = match head.get("alg").and_then(|a| a.as_str()) {
            Some("HS256") => JwtAlg::HS256,
            Some("RS256") => JwtAlg::RS256,
            _ => return Err("unsupported alg"),
        };
        let kid = head.get("kid").and_then(|k| k.as_str());
        let sig = b64(sig).map_err(|_| "malformed signature")?;
        let signed = &token[..h.len() + 1 + p.len()];
        let ok = self
            .keys
            .iter()
            .filter(|k| kid.is_none() || k.kid.is_none() || k.kid.as_deref() == kid)
            .any(|k| match (&k.key, alg) {
                (Key::Hs256(key), JwtAlg::HS256) => {
                    hmac::verify(key, signed.as_bytes(), &sig).is_ok()
                }
                (Key::Rs256 { n, e }, JwtAlg::RS256) => signature::RsaPublicKeyComponents {
                    n: n.as_slice(),
                    e: e.as_slice(),
                }
                .verify(
                    &signature::RSA_PKCS1_2048_8192_SHA256,
                    signed.as_bytes(),
                    &sig,
                )
                .is_ok(),
                _ => false,
            });
        if !ok {
            return Err("bad signature");
        }
        let claims: serde_json::Value =
            serde_json::from_slice(&b64(p).map_err(|_| "malformed payload")?)
                .map_err(|_| "malformed payload")?;
        let serde_json::Value::Object(claims) = claims else {
            return Err("malformed payload");
        };
        let num = |k: &str| claims.get(k).and_then(|v| v.as_u64());
        if num("exp").is_some_and(|exp| now > exp + LEEWAY) {
            return Err("expired");
        }
        if num("nbf").is_some_and(|nbf| now + LEEWAY < nbf) {
            return Err("not yet valid");
        }
        if let Some(iss) = &self.issuer {
            if claims.get("iss").and_then(|v| v.as_str()) != Some(iss) {
                return Err("wrong issuer");
            }
        }
        if let Some(aud) = &self.audience {
            let ok = match claims.get("aud") {
                Some(serde_json::Value::String(s)) => s == aud,
                Some(serde_json::Value::Array(a)) => a.iter().any(|v| v.as_str() == Some(aud)),
                _ => false,
            };
            if !ok {
                return Err("wrong audience");
            }
        }
        Ok(claims)
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
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let result = match token {
            Some(t) if !t.is_empty() => self.verify(t, now),
            _ => Err("missing token"),
        };
        match result {
            Ok(claims) => {
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
