//! Verification keys: static ones from `jwt_keys` and the usable keys of a JWKS document.

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyOperations, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};

use super::ring_provider::alg_fits;
use keymaster_config::{JwtAlg, JwtKey};

/// One verification key.
pub(super) struct Key {
    pub(super) kid: Option<String>,
    pub(super) key: DecodingKey,
    /// The one algorithm the key is for; `None`: any of its family (a JWK without `alg`).
    alg: Option<Algorithm>,
}

impl Key {
    /// Whether a token signed with `alg` and naming `kid` may be checked with this key: the
    /// algorithm fits the key, and the ids are equal unless either has none.
    pub(super) fn accepts(&self, alg: Algorithm, kid: Option<&str>) -> bool {
        self.alg.is_none_or(|a| a == alg)
            && alg_fits(alg, &self.key)
            && (kid.is_none() || self.kid.is_none() || self.kid.as_deref() == kid)
    }
}

/// A `jwt_keys` entry (validated when the config loaded).
pub(super) fn from_config(k: &JwtKey) -> Result<Key, String> {
    let pem = k.pem.as_deref().map(str::as_bytes);
    let key = match (k.alg, pem) {
        (JwtAlg::HS256, _) => Ok(DecodingKey::from_secret(
            k.secret.as_deref().unwrap_or("").as_bytes(),
        )),
        (JwtAlg::RS256, Some(pem)) => DecodingKey::from_rsa_pem(pem),
        (JwtAlg::RS256, None) => DecodingKey::from_rsa_components(
            k.n.as_deref().unwrap_or(""),
            k.e.as_deref().unwrap_or(""),
        ),
        (JwtAlg::ES256, pem) => DecodingKey::from_ec_pem(pem.unwrap_or_default()),
        (JwtAlg::EdDSA, pem) => DecodingKey::from_ed_pem(pem.unwrap_or_default()),
    };
    let alg = match k.alg {
        JwtAlg::HS256 => Algorithm::HS256,
        JwtAlg::RS256 => Algorithm::RS256,
        JwtAlg::ES256 => Algorithm::ES256,
        JwtAlg::EdDSA => Algorithm::EdDSA,
    };
    Ok(Key {
        kid: k.kid.clone(),
        key: key.map_err(|e| format!("{} key: {e}", k.alg.as_str()))?,
        alg: Some(alg),
    })
}

/// The usable keys of a JWKS document (`{"keys": [...]}`) and how many were skipped:
/// signature keys of type RSA, EC (P-256, P-384) and OKP (Ed25519). Shared secrets (`oct`),
/// encryption keys and keys this gateway cannot use are skipped. A document with no usable
/// key is an error (the last good set is kept).
pub(super) fn parse_jwks(body: &[u8]) -> Result<(Vec<Key>, usize), String> {
    let doc: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
    let Some(list) = doc.get("keys").and_then(|k| k.as_array()) else {
        return Err("not a JWKS document: no \"keys\" array".into());
    };
    let keys: Vec<Key> = list.iter().filter_map(from_jwk).collect();
    if keys.is_empty() {
        return Err(format!("no usable key among {} keys", list.len()));
    }
    let skipped = list.len() - keys.len();
    Ok((keys, skipped))
}

/// One JWK, if it is a signature key of a kind this gateway verifies.
fn from_jwk(v: &serde_json::Value) -> Option<Key> {
    let jwk: Jwk = serde_json::from_value(v.clone()).ok()?;
    let c = &jwk.common;
    let for_signatures = c
        .public_key_use
        .as_ref()
        .is_none_or(|u| *u == PublicKeyUse::Signature)
        && c.key_operations
            .as_ref()
            .is_none_or(|ops| ops.contains(&KeyOperations::Verify));
    let named = match c.key_algorithm {
        Some(a) => Some(format!("{a:?}").parse::<Algorithm>().ok()?),
        None => None,
    };
    let alg = match (&jwk.algorithm, named) {
        (AlgorithmParameters::OctetKey(_), _) => return None,
        (AlgorithmParameters::RSA(_), alg) => alg,
        (AlgorithmParameters::EllipticCurve(p), alg) => Some(curve_alg(&p.curve, alg)?),
        (AlgorithmParameters::OctetKeyPair(p), alg) => Some(curve_alg(&p.curve, alg)?),
    };
    let key = DecodingKey::from_jwk(&jwk).ok()?;
    if !for_signatures || alg.is_some_and(|a| !alg_fits(a, &key)) {
        return None;
    }
    Some(Key {
        kid: c.key_id.clone(),
        key,
        alg,
    })
}

/// The algorithm of a curve, which a JWK's `alg` (when given) must agree with.
fn curve_alg(curve: &EllipticCurve, named: Option<Algorithm>) -> Option<Algorithm> {
    let alg = match curve {
        EllipticCurve::P256 => Algorithm::ES256,
        EllipticCurve::P384 => Algorithm::ES384,
        EllipticCurve::Ed25519 => Algorithm::EdDSA,
        EllipticCurve::P521 => return None,
    };
    named.is_none_or(|n| n == alg).then_some(alg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jwks_keeps_signature_keys_it_can_use() {
        let doc = serde_json::json!({"keys": [
            {"kty": "RSA", "kid": "r", "n": "s8u8zGYVJU2Qt8uFyqzJvTe4HI_7VZIEP2M6H-ukgfwdXaJrCW5b_CeA8Eb7ZzQ7tDbFrQHj3u3i81sWkOlAgYUIfeOemNp26EhM0SOJGn7vMOWNnncFm3JmfKy54-wn9M3KTKlEMC6p0-cLoafeTflyZKTgQ8PK71UKcZvnl829YUMhlI8vMIzdRTsQulKpqsQudTlHdQ1-yR9jtfLEpxTlfJahnWc3KFCNS1IFzBQYunzMuCWQiQbyzpbs7z7WyrhsnSOsqwohY-ay6gBYuYisTyx5KnxSuBikYf7zrJbZR4LyPKURqPupDRaxtfT2lcVJaZ_gmCChDY0X7xX4jQ", "e": "AQAB"},
            {"kty": "RSA", "kid": "enc", "use": "enc", "n": "AQAB", "e": "AQAB"},
            {"kty": "oct", "kid": "secret", "k": "c2VjcmV0"},
            {"kty": "OKP", "kid": "ed", "crv": "Ed25519", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"},
            {"kty": "EC", "kid": "p521", "crv": "P-521", "x": "AQ", "y": "AQ"},
            {"kty": "EC", "kid": "mixed", "crv": "P-256", "alg": "ES384", "x": "AQ", "y": "AQ"},
            {"kty": "weird"},
        ]});
        let (keys, skipped) = parse_jwks(doc.to_string().as_bytes()).unwrap();
        let kids: Vec<_> = keys.iter().map(|k| k.kid.as_deref().unwrap()).collect();
        assert_eq!(kids, ["r", "ed"]);
        assert_eq!(skipped, 5);
        assert!(keys[0].accepts(Algorithm::RS256, Some("r")));
        assert!(keys[0].accepts(Algorithm::PS256, None));
        assert!(!keys[0].accepts(Algorithm::HS256, Some("r")));
        assert!(!keys[0].accepts(Algorithm::RS256, Some("other")));
        assert!(keys[1].accepts(Algorithm::EdDSA, Some("ed")));
        assert!(!keys[1].accepts(Algorithm::ES256, Some("ed")));
    }

    #[test]
    fn a_document_without_usable_keys_is_an_error() {
        for doc in [
            &b"[]"[..],
            b"{\"keys\": []}",
            b"{\"keys\": [{\"kty\": \"oct\", \"k\": \"AA\"}]}",
            b"<html>",
        ] {
            assert!(parse_jwks(doc).is_err(), "{}", String::from_utf8_lossy(doc));
        }
    }
}
