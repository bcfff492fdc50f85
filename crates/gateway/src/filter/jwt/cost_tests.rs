//! What verifying with the `jsonwebtoken` crate costs next to a hand-written check (the
//! filter's previous implementation: split, base64, JSON, ring, the claim checks), per token
//! kind. Run by hand (`cargo test -p keymaster-gateway --lib jwt_verify_cost -- --ignored
//! --nocapture`); the numbers are in `docs/filters.md`.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::rand::SystemRandom;
use ring::signature::{self as sig, EcdsaKeyPair, Ed25519KeyPair, KeyPair};
use std::time::Instant;

use super::Jwt;
use keymaster_config::{FilterConfig, JwtAlg, JwtKey};

const SECRET: &str = "0123456789abcdef-test-secret";

fn b64(b: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(b)
}

fn signing_input(alg: &str) -> String {
    let claims = serde_json::json!({"sub": "user-7", "iss": "https://issuer.example",
        "aud": "api", "exp": 4_000_000_000u64, "nbf": 1_000_000_000u64});
    let head = serde_json::json!({"alg": alg, "kid": "k", "typ": "JWT"});
    format!(
        "{}.{}",
        b64(head.to_string().as_bytes()),
        b64(claims.to_string().as_bytes())
    )
}

/// The previous hand-written check (the claim checks included).
fn by_hand(token: &str, check: &dyn Fn(&[u8], &[u8]) -> bool) -> bool {
    let mut parts = token.split('.');
    let (Some(h), Some(p), Some(s)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let head: serde_json::Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(h).unwrap()).unwrap();
    let _ = (head.get("alg"), head.get("kid"));
    let sig = URL_SAFE_NO_PAD.decode(s).unwrap();
    if !check(&token.as_bytes()[..h.len() + 1 + p.len()], &sig) {
        return false;
    }
    let claims: serde_json::Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(p).unwrap()).unwrap();
    let num = |k: &str| claims.get(k).and_then(|v| v.as_u64());
    num("exp").is_some_and(|e| e > 1)
        && num("nbf").is_some_and(|n| n > 1)
        && claims.get("iss").and_then(|v| v.as_str()) == Some("https://issuer.example")
        && claims.get("aud").and_then(|v| v.as_str()) == Some("api")
}

fn filter(alg: JwtAlg, secret: Option<&str>, pem: Option<String>) -> Jwt {
    let f = FilterConfig {
        name: "cost".into(),
        issuer: Some("https://issuer.example".into()),
        audience: Some("api".into()),
        jwt_keys: vec![JwtKey {
            kid: Some("k".into()),
            alg,
            secret: secret.map(Into::into),
            pem,
            ..Default::default()
        }],
        ..Default::default()
    };
    Jwt::compile(&f, &crate::metrics::Metrics::new()).unwrap()
}

fn pem(prefix: &[u8], public: &[u8]) -> String {
    let der = [prefix, public].concat();
    let text = base64::engine::general_purpose::STANDARD.encode(der);
    format!("-----BEGIN PUBLIC KEY-----\n{text}\n-----END PUBLIC KEY-----\n")
}

/// Nanoseconds per call of `f`.
fn time(rounds: u32, f: impl Fn() -> bool) -> u128 {
    assert!(f());
    let start = Instant::now();
    for _ in 0..rounds {
        assert!(std::hint::black_box(f()));
    }
    start.elapsed().as_nanos() / u128::from(rounds)
}

#[test]
#[ignore = "a measurement, run by hand"]
fn jwt_verify_cost() {
    let rng = SystemRandom::new();
    // HS256
    let input = signing_input("HS256");
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, SECRET.as_bytes());
    let hs = format!(
        "{input}.{}",
        b64(ring::hmac::sign(&key, input.as_bytes()).as_ref())
    );
    let jwt = filter(JwtAlg::HS256, Some(SECRET), None);
    let hand = |m: &[u8], s: &[u8]| ring::hmac::verify(&key, m, s).is_ok();
    report(
        "HS256",
        time(20_000, || jwt.verify(&hs).is_ok()),
        time(20_000, || by_hand(&hs, &hand)),
    );
    // ES256
    let alg = &sig::ECDSA_P256_SHA256_FIXED_SIGNING;
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
    let pair = EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).unwrap();
    let input = signing_input("ES256");
    let es = format!(
        "{input}.{}",
        b64(pair.sign(&rng, input.as_bytes()).unwrap().as_ref())
    );
    let prefix = URL_SAFE_NO_PAD
        .decode("MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgA")
        .unwrap();
    let jwt = filter(
        JwtAlg::ES256,
        None,
        Some(pem(&prefix, pair.public_key().as_ref())),
    );
    let public = pair.public_key().as_ref().to_vec();
    let hand = |m: &[u8], s: &[u8]| {
        sig::UnparsedPublicKey::new(&sig::ECDSA_P256_SHA256_FIXED, &public)
            .verify(m, s)
            .is_ok()
    };
    report(
        "ES256",
        time(2_000, || jwt.verify(&es).is_ok()),
        time(2_000, || by_hand(&es, &hand)),
    );
    // EdDSA
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
    let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
    let input = signing_input("EdDSA");
    let ed = format!("{input}.{}", b64(pair.sign(input.as_bytes()).as_ref()));
    let prefix = [
        0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
    ];
    let jwt = filter(
        JwtAlg::EdDSA,
        None,
        Some(pem(&prefix, pair.public_key().as_ref())),
    );
    let public = pair.public_key().as_ref().to_vec();
    let hand = |m: &[u8], s: &[u8]| {
        sig::UnparsedPublicKey::new(&sig::ED25519, &public)
            .verify(m, s)
            .is_ok()
    };
    report(
        "EdDSA",
        time(2_000, || jwt.verify(&ed).is_ok()),
        time(2_000, || by_hand(&ed, &hand)),
    );
}

fn report(alg: &str, with_crate: u128, by_hand: u128) {
    println!(
        "{alg}: jsonwebtoken + ring {with_crate} ns, by hand {by_hand} ns, difference {} ns",
        with_crate as i128 - by_hand as i128
    );
}
