//! The `jwt` built-in with static keys: HS256 and RS256 tokens, ES256 and EdDSA PEM keys,
//! kid selection, exp/nbf with leeway, iss/aud, claim headers, key rotation by reload, and
//! its config validation. Key sets fetched from a URL are tested in `filters_jwks.rs`.
mod jwks_support;
mod support;
use base64::Engine;
use bytes::Bytes;
use http_body_util::Full;
use jwks_support::{b64, now, TestKey};
use ring::signature::{RsaKeyPair, RSA_PKCS1_SHA256};
use std::net::SocketAddr;
use support::*;

/// A 2048-bit test-only RSA key (PKCS#8 DER, base64) and its modulus (base64url).
const RSA_PKCS8: &str = "MIIEvgIBADANBgkqhkiG9w0BAQEFAASCBKgwggSkAgEAAoIBAQCzy7zMZhUlTZC3y4XKrMm9N7gcj/tVkgQ/Yzof66SB/B1domsJblv8J4DwRvtnNDu0NsWtAePe7eLzWxaQ6UCBhQh9456Y2nboSEzRI4kafu8w5Y2edwWbcmZ8rLnj7Cf0zcpMqUQwLqnT5wuhp95N+XJkpOBDw8rvVQpxm+eXzb1hQyGUjy8wjN1FOxC6UqmqxC51OUd1DX7JH2O18sSnFOV8lqGdZzcoUI1LUgXMFBi6fMy4JZCJBvLOluzvPtbKuGydI6yrCiFj5rLqAFi5iKxPLHkqfFK4GKRh/vOsltlHgvI8pRGo+6kNFrG19PaVxUlpn+CYIKENjRfvFfiNAgMBAAECggEAF3zirasaURS4dqJCWK9I7YylYynWEiAwqN08HyZoB8kZRv2sUP+XSbIZcIo9Voam1Ayht0+7ZoiaMONx571o/WKVMOj28436oa6sRlgHlawGcFNUtGJlG6EOzXO9Fw7nS15E8s3cCBVYf0O8K8Kj0njnXkmBuKiPzsNDyYKt9xEkAM4N5uNQUD6FdXx4IvC5YPtqnDYnHgE4CQi66TGjcS3Mqz+KQsT7dsV+LcPG0/+QWFVAcbzG+BxbPNNBIwhtuFqyqtHtRPucunlc/0d1wMyXJD4fn92WOYO9uoR0cJlYjtws6EuhxTADNE/EvSrcMfMKgqmyh53f2HrDxASLiwKBgQDZP3BnkUyVCLjFfTBohyIS93pRUXsqgY5PGaowuRb4mcPkx6Uy06UqqTVVMiIpFZOwrQBZWgXg81v7iETYeb3R/YUQX1O+FziM2xMcAKtYvIBi1FiMS2q2R8KOAVFLBysMuHxt2Q7vqRJwSIijbDDs88a3hS80h9vdoClOkBM9IwKBgQDT3hCpNb34Cz9uuB8Pncbz6Vdci5T9LSLwhrlrrtCQqJYvGOWbRaG/mQRgQ1lgmW0BVHBkYy93s9QZhW10qGizkPOzJihRSMjuswO3bMO1ZFDvG6yIxu6ftcDQFj+fjfhM8t+2UzbdhCBJyXHQAXJOeKYX2BWtPDn0h5R9DfgGjwKBgQCcR8erqVmnCHwrDXDKcROxAziJ0QzCOirOek709+EveyXxqTEMzDXP56OHIyZx2aTB/uH2ZQ0/krGD07Z657EGo9KaQYkzgO7cXSh1B4I7tnbBIbKFUid081Bg6U+6onB0mS5hszjMbRrnjTZGIalce81i7btUlbszxmiQrJI6cwKBgQCiXRwHkNf0ryn9f7zOCuvdIIWCtrWHEIAmNBkFHQNY2Nm/XiUXyVUbr/hajUKBdRLEYiF/zUMjSPzSUh5/uFAEzKD2OdfL8yuJQkcm2oNhD2+2zk56w3k7i94nmeVIMVSII9itsTfqqsbTxT0jWvhuiqc+vqpeCDmh3AU/kOTyoQKBgBYIg78ExDB+fuPp6Ox31cV1Kt9Z+hp/Wsex7vVo5VEGGj0brbNYsjaFgOpHAb+v0ytNnRXrZ5yu6p/m6SLqjRdGTKVhSYmBbj3sfVM3yz9rnN2ZzyX7DW9w2ODDc0/v3tRmitm/GN6ZjP4twDiencj6KKU0JCEnQ9osVTHOYkK9";
const RSA_N: &str = "s8u8zGYVJU2Qt8uFyqzJvTe4HI_7VZIEP2M6H-ukgfwdXaJrCW5b_CeA8Eb7ZzQ7tDbFrQHj3u3i81sWkOlAgYUIfeOemNp26EhM0SOJGn7vMOWNnncFm3JmfKy54-wn9M3KTKlEMC6p0-cLoafeTflyZKTgQ8PK71UKcZvnl829YUMhlI8vMIzdRTsQulKpqsQudTlHdQ1-yR9jtfLEpxTlfJahnWc3KFCNS1IFzBQYunzMuCWQiQbyzpbs7z7WyrhsnSOsqwohY-ay6gBYuYisTyx5KnxSuBikYf7zrJbZR4LyPKURqPupDRaxtfT2lcVJaZ_gmCChDY0X7xX4jQ";
const SECRET: &str = "0123456789abcdef-test-secret";
const SECRET2: &str = "fedcba9876543210-next-secret";

fn hs256(secret: &str, kid: Option<&str>, claims: serde_json::Value) -> String {
    let mut head = serde_json::json!({"alg": "HS256", "typ": "JWT"});
    if let Some(k) = kid {
        head["kid"] = k.into();
    }
    let signed = format!(
        "{}.{}",
        b64(head.to_string().as_bytes()),
        b64(claims.to_string().as_bytes())
    );
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    let sig = ring::hmac::sign(&key, signed.as_bytes());
    format!("{signed}.{}", b64(sig.as_ref()))
}

fn rs256(kid: &str, claims: serde_json::Value) -> String {
    let head = serde_json::json!({"alg": "RS256", "kid": kid});
    let signed = format!(
        "{}.{}",
        b64(head.to_string().as_bytes()),
        b64(claims.to_string().as_bytes())
    );
    let der = base64::engine::general_purpose::STANDARD
        .decode(RSA_PKCS8)
        .unwrap();
    let pair = RsaKeyPair::from_pkcs8(&der).unwrap();
    let mut sig = vec![0u8; pair.public().modulus_len()];
    pair.sign(
        &RSA_PKCS1_SHA256,
        &ring::rand::SystemRandom::new(),
        signed.as_bytes(),
        &mut sig,
    )
    .unwrap();
    format!("{signed}.{}", b64(&sig))
}

fn jwt_config(origin: SocketAddr, secret: &str) -> keymaster_config::Config {
    let text = config_text(
        origin,
        "",
        &format!(
            r#"
[[filters]]
name = "auth"
type = "jwt"
issuer = "https://issuer.example"
audience = "api"
claims_to_headers = {{ sub = "x-user", scope = "x-scope" }}
jwt_keys = [
  {{ kid = "h1", alg = "HS256", secret = "{secret}" }},
  {{ kid = "r1", alg = "RS256", n = "{RSA_N}", e = "AQAB" }},
]
"#
        ),
    );
    keymaster_config::load_str(&text, "<test>").unwrap_or_else(|e| panic!("{e}"))
}

async fn call(addr: SocketAddr, token: Option<&str>, extra: &[(&str, &str)]) -> Reply {
    let mut b = http::Request::get("/x");
    if let Some(t) = token {
        b = b.header("authorization", format!("Bearer {t}"));
    }
    for (n, v) in extra {
        b = b.header(*n, *v);
    }
    Client::connect(addr)
        .await
        .send(b.body(Full::new(Bytes::new())).unwrap())
        .await
}

fn good_claims() -> serde_json::Value {
    serde_json::json!({
        "sub": "user-7", "scope": "read", "iss": "https://issuer.example",
        "aud": ["other", "api"], "exp": now() + 300, "nbf": now() - 10
    })
}

#[tokio::test]
async fn jwt_accepts_valid_tokens_and_refuses_the_rest() {
    let o = head_echo_origin().await;
    let gw = Gateway::start(jwt_config(o.addr, SECRET), ConfigSource::Memory).unwrap();
    let addr = gw.listener_addr("main").unwrap();

    for token in [
        hs256(SECRET, Some("h1"), good_claims()),
        hs256(SECRET, None, good_claims()),
        rs256("r1", good_claims()),
    ] {
        let r = call(addr, Some(&token), &[("x-user", "spoofed")]).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let head = String::from_utf8_lossy(&r.body).into_owned();
        assert_eq!(head_header(&head, "x-user"), Some("user-7"));
        assert_eq!(head_header(&head, "x-scope"), Some("read"));
        assert!(!head.contains("spoofed"));
    }

    let mut c = good_claims();
    c["exp"] = (now() - 3600).into();
    let expired = hs256(SECRET, Some("h1"), c);
    let mut c = good_claims();
    c["aud"] = "other".into();
    let wrong_aud = hs256(SECRET, Some("h1"), c);
    let mut c = good_claims();
    c["iss"] = "https://evil.example".into();
    let wrong_iss = rs256("r1", c);
    let mut c = good_claims();
    c["nbf"] = (now() + 3600).into();
    let early = hs256(SECRET, None, c);
    let good = hs256(SECRET, Some("h1"), good_claims());
    let mut tampered: Vec<&str> = good.split('.').collect();
    let other_payload = b64(serde_json::json!({"sub": "admin"}).to_string().as_bytes());
    tampered[1] = &other_payload;
    let tampered = tampered.join(".");
    let none_alg = format!(
        "{}.{}.",
        b64(br#"{"alg":"none"}"#),
        b64(good_claims().to_string().as_bytes())
    );
    for (why, token) in [
        ("missing token", None),
        ("expired", Some(expired.as_str())),
        ("wrong audience", Some(wrong_aud.as_str())),
        ("wrong issuer", Some(wrong_iss.as_str())),
        ("not yet valid", Some(early.as_str())),
        ("bad signature", Some(tampered.as_str())),
        (
            "bad signature",
            Some(&*hs256("another-secret-0123456", Some("h1"), good_claims())),
        ),
        (
            "bad signature",
            Some(&*hs256(SECRET, Some("r1"), good_claims())),
        ),
        ("unsupported alg", Some(none_alg.as_str())),
        ("malformed token", Some("abc")),
    ] {
        let r = call(addr, token, &[]).await;
        assert_eq!(r.status, 401, "{why}");
        let challenge = r.headers["www-authenticate"].to_str().unwrap();
        assert!(challenge.contains(why), "{why}: {challenge}");
    }
    assert_eq!(o.connections(), 1);
    gw.shutdown();
}

#[tokio::test]
async fn jwt_keys_rotate_by_reload() {
    let o = head_echo_origin().await;
    let gw = Gateway::start(jwt_config(o.addr, SECRET), ConfigSource::Memory).unwrap();
    let addr = gw.listener_addr("main").unwrap();
    let old = hs256(SECRET, Some("h1"), good_claims());
    let new = hs256(SECRET2, Some("h1"), good_claims());
    assert_eq!(call(addr, Some(&old), &[]).await.status, 200);
    assert_eq!(call(addr, Some(&new), &[]).await.status, 401);
    gw.reload(jwt_config(o.addr, SECRET2)).unwrap();
    assert_eq!(call(addr, Some(&old), &[]).await.status, 401);
    assert_eq!(call(addr, Some(&new), &[]).await.status, 200);
    gw.shutdown();
}

#[test]
fn jwt_config_is_validated() {
    let text = r#"[[listeners]]
name = "main"
address = "127.0.0.1:0"

[[filters]]
name = "auth"
type = "jwt"
stage = "post"
claims_to_headers = { sub = "bad header" }
jwt_keys = [
  { alg = "HS256", secret = "short", n = "x" },
  { alg = "RS256", n = "not base64!" },
]
"#;
    let err = keymaster_config::load_str(text, "gw.toml")
        .unwrap_err()
        .to_string();
    let lines: Vec<&str> = err.lines().collect();
    let want = [
        "gw.toml:8:1: filters[0].stage: a jwt filter cannot run in stage \"post\"",
        "gw.toml:9:23: filters[0].claims_to_headers.sub: \"bad header\" is not a valid HTTP header name",
        "gw.toml:11:20: filters[0].jwt_keys[0].secret: too short for HS256",
        "gw.toml:11:38: filters[0].jwt_keys[0].n: n is only used by RS256 keys",
        "gw.toml:12:3: filters[0].jwt_keys[1]: an RS256 key needs e",
        "gw.toml:12:20: filters[0].jwt_keys[1].n: n is not base64url",
    ];
    assert_eq!(lines.len(), want.len(), "{err}");
    for (g, w) in lines.iter().zip(want) {
        assert!(g.starts_with(w), "got {g:?}\nwant {w:?}");
    }
}

fn pem_config(origin: SocketAddr, es: &TestKey, ed: &TestKey) -> keymaster_config::Config {
    let text = config_text(
        origin,
        "",
        &format!(
            r#"
[[filters]]
name = "auth"
type = "jwt"
issuer = "https://issuer.example"
audience = "api"
leeway = "5s"
jwt_keys = [
  {{ kid = "es", alg = "ES256", pem = """{}""" }},
  {{ kid = "ed", alg = "EdDSA", pem = """{}""" }},
]
"#,
            es.pem(),
            ed.pem()
        ),
    );
    keymaster_config::load_str(&text, "<test>").unwrap_or_else(|e| panic!("{e}"))
}

/// `good_claims` with `key` set to `value` (`null`: removed).
fn claims_with(key: &str, value: serde_json::Value) -> serde_json::Value {
    let mut c = good_claims();
    match value {
        serde_json::Value::Null => {
            c.as_object_mut().unwrap().remove(key);
        }
        v => c[key] = v,
    }
    c
}

#[tokio::test]
async fn jwt_es256_and_eddsa_pem_keys_with_issuer_audience_and_leeway() {
    let (es, ed, stranger) = (TestKey::es256(), TestKey::ed25519(), TestKey::es256());
    let o = head_echo_origin().await;
    let gw = Gateway::start(pem_config(o.addr, &es, &ed), ConfigSource::Memory).unwrap();
    let addr = gw.listener_addr("main").unwrap();
    let null = serde_json::Value::Null;
    for token in [
        es.sign(Some("es"), &good_claims()),
        ed.sign(Some("ed"), &good_claims()),
        ed.sign(None, &good_claims()),
        es.sign(Some("es"), &claims_with("exp", (now() - 2).into())),
        ed.sign(Some("ed"), &claims_with("nbf", (now() + 2).into())),
        ed.sign(Some("ed"), &claims_with("exp", null.clone())),
    ] {
        let r = call(addr, Some(&token), &[]).await;
        assert_eq!(r.status, 200, "{:?}", r.headers.get("www-authenticate"));
    }
    for (why, token) in [
        (
            "expired",
            es.sign(None, &claims_with("exp", (now() - 30).into())),
        ),
        (
            "not yet valid",
            ed.sign(None, &claims_with("nbf", (now() + 30).into())),
        ),
        (
            "wrong issuer",
            es.sign(None, &claims_with("iss", "https://evil.example".into())),
        ),
        (
            "wrong issuer",
            ed.sign(None, &claims_with("iss", null.clone())),
        ),
        (
            "wrong audience",
            es.sign(None, &claims_with("aud", "other".into())),
        ),
        (
            "wrong audience",
            ed.sign(None, &claims_with("aud", null.clone())),
        ),
        (
            "malformed claims",
            es.sign(None, &claims_with("exp", "9999999999".into())),
        ),
        ("bad signature", stranger.sign(Some("es"), &good_claims())),
        ("bad signature", es.sign(Some("ed"), &good_claims())),
    ] {
        let r = call(addr, Some(&token), &[]).await;
        assert_eq!(r.status, 401, "{why}");
        let challenge = r.headers["www-authenticate"].to_str().unwrap();
        assert!(challenge.contains(why), "{why}: {challenge}");
    }
    gw.shutdown();
}

#[test]
fn jwt_pem_jwks_and_leeway_are_validated() {
    let ed = TestKey::ed25519().pem();
    let text = format!(
        r#"[[listeners]]
name = "main"
address = "127.0.0.1:0"

[[filters]]
name = "auth"
type = "jwt"
leeway = "2h"
jwt_keys = [
  {{ kid = "a", alg = "ES256" }},
  {{ alg = "ES256", pem = """{ed}""" }},
  {{ alg = "RS256", pem = "x", n = "AQAB" }},
]
jwks = {{ url = "ftp://keys.example/jwks", refresh = "10s", min_refresh = "1m" }}

[[filters]]
name = "nokeys"
type = "jwt"

[[filters]]
name = "cleartext"
type = "jwt"
jwks = {{ url = "http://keys.example/jwks", ca = "ca.pem" }}
"#
    );
    let err = keymaster_config::load_str(&text, "gw.toml")
        .unwrap_err()
        .to_string();
    let lines: Vec<&str> = err.lines().collect();
    let want = [
        "gw.toml:8:1: filters[0].leeway: too long",
        "gw.toml:10:3: filters[0].jwt_keys[0]: an ES256 key needs pem",
        "gw.toml:11:20: filters[0].jwt_keys[1].pem: not a P-256 EC public key in PEM",
        "gw.toml:15:20: filters[0].jwt_keys[2].pem: not an RSA public key in PEM",
        "gw.toml:15:31: filters[0].jwt_keys[2].n: n is not used with pem",
        "gw.toml:17:10: filters[0].jwks.url: \"ftp://keys.example/jwks\" is not an http or https URL",
        "gw.toml:17:60: filters[0].jwks.min_refresh: must be between \"100ms\" and refresh",
        "gw.toml:21:1: filters[1].type: a jwt filter needs jwt_keys or jwks",
        "gw.toml:26:44: filters[2].jwks.ca: ca is only used with an https url",
    ];
    assert_eq!(lines.len(), want.len(), "{err}");
    for (g, w) in lines.iter().zip(want) {
        assert!(g.starts_with(w), "got {g:?}\nwant {w:?}");
    }
}
