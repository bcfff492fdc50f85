//! Settings of the `jwt` filter's keys: static keys (`jwt_keys`) and a key set fetched from
//! a URL (`jwks`). Every key has a default (documented in `docs/configuration.md`).

use serde::{Deserialize, Serialize};

use crate::units::{ByteSize, Duration};

/// The algorithm of a static JWT key.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
pub enum JwtAlg {
    /// HMAC with SHA-256 and a shared `secret`.
    #[default]
    HS256,
    /// RSA PKCS#1 v1.5 with SHA-256; the public key as JWK `n` and `e`, or `pem`.
    RS256,
    /// ECDSA on P-256 with SHA-256; the public key as `pem`.
    ES256,
    /// Ed25519; the public key as `pem`.
    EdDSA,
}

impl JwtAlg {
    pub fn as_str(self) -> &'static str {
        match self {
            JwtAlg::HS256 => "HS256",
            JwtAlg::RS256 => "RS256",
            JwtAlg::ES256 => "ES256",
            JwtAlg::EdDSA => "EdDSA",
        }
    }
}

/// One static JWT verification key.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct JwtKey {
    /// Key id matched against the token's `kid` (tokens without `kid` try every key of the alg).
    pub kid: Option<String>,
    /// `"HS256"`, `"RS256"`, `"ES256"` or `"EdDSA"`.
    pub alg: JwtAlg,
    /// HS256: the shared secret (UTF-8 text).
    pub secret: Option<String>,
    /// RS256: the modulus, base64url (JWK `n`).
    pub n: Option<String>,
    /// RS256: the exponent, base64url (JWK `e`, usually "AQAB").
    pub e: Option<String>,
    /// RS256, ES256, EdDSA: the public key in PEM (`BEGIN PUBLIC KEY`; RS256 also
    /// `BEGIN RSA PUBLIC KEY`).
    pub pem: Option<String>,
}

/// A JSON Web Key Set fetched from `url` by a background thread, never on a request's path.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(deny_unknown_fields, default)]
pub struct JwksConfig {
    /// `http://` or `https://` URL of the key set (a JWKS document: `{"keys": [...]}`).
    pub url: String,
    /// How often the key set is fetched again.
    pub refresh: Duration,
    /// The least time between two fetches: a token with an unknown `kid` asks for an early
    /// fetch, at most one per this interval; a failed fetch is retried after it.
    pub min_refresh: Duration,
    /// Bound on one fetch: connect, TLS, request and the whole body.
    pub timeout: Duration,
    /// Largest key set document read; a longer one fails the fetch.
    pub max_size: ByteSize,
    /// `https`: PEM file of the CA certificates the server's certificate must chain to.
    /// Absent: the Mozilla root set compiled into the gateway.
    pub ca: Option<String>,
}

impl Default for JwksConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            refresh: Duration::from_secs(300),
            min_refresh: Duration::from_secs(30),
            timeout: Duration::from_secs(5),
            max_size: ByteSize(256 * 1024),
            ca: None,
        }
    }
}
