//! JWT test helpers: ES256 and Ed25519 keys made with ring (as JWKs and PEM), tokens signed
//! with them, and a real JWKS server on 127.0.0.1:0 whose document and behaviour (serve,
//! fail, stall) a test changes while it runs. The server has its own thread and runtime, so
//! a gateway starting on the test's runtime can fetch from it.
#![allow(dead_code)]

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, Ed25519KeyPair, KeyPair};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

pub fn b64(b: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(b)
}

pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A signing key of a test: ES256 (P-256) or EdDSA (Ed25519).
pub enum TestKey {
    Es256(EcdsaKeyPair),
    Ed25519(Ed25519KeyPair),
}

/// The DER prefix of an Ed25519 SubjectPublicKeyInfo (the 32-byte key follows).
const ED25519_SPKI: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

impl TestKey {
    pub fn es256() -> TestKey {
        let alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
        TestKey::Es256(EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).unwrap())
    }

    pub fn ed25519() -> TestKey {
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
        TestKey::Ed25519(Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap())
    }

    pub fn alg(&self) -> &'static str {
        match self {
            TestKey::Es256(_) => "ES256",
            TestKey::Ed25519(_) => "EdDSA",
        }
    }

    /// The public key as a JWK with `kid`.
    pub fn jwk(&self, kid: &str) -> serde_json::Value {
        match self {
            TestKey::Es256(k) => {
                let p = k.public_key().as_ref();
                serde_json::json!({"kty": "EC", "crv": "P-256", "kid": kid, "use": "sig",
                    "x": b64(&p[1..33]), "y": b64(&p[33..65])})
            }
            TestKey::Ed25519(k) => serde_json::json!({"kty": "OKP", "crv": "Ed25519",
                "kid": kid, "alg": "EdDSA", "x": b64(k.public_key().as_ref())}),
        }
    }

    /// The public key in PEM (SubjectPublicKeyInfo).
    pub fn pem(&self) -> String {
        let der = match self {
            TestKey::Es256(k) => {
                let mut der = p256_prefix();
                der.extend_from_slice(k.public_key().as_ref());
                der
            }
            TestKey::Ed25519(k) => {
                let mut der = ED25519_SPKI.to_vec();
                der.extend_from_slice(k.public_key().as_ref());
                der
            }
        };
        format!(
            "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
            STANDARD.encode(der)
        )
    }

    /// A token with header `alg`/`kid` and `claims`, signed with this key.
    pub fn sign(&self, kid: Option<&str>, claims: &serde_json::Value) -> String {
        let mut head = serde_json::json!({"alg": self.alg(), "typ": "JWT"});
        if let Some(k) = kid {
            head["kid"] = k.into();
        }
        let signed = format!(
            "{}.{}",
            b64(head.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let sig = match self {
            TestKey::Es256(k) => k
                .sign(&SystemRandom::new(), signed.as_bytes())
                .unwrap()
                .as_ref()
                .to_vec(),
            TestKey::Ed25519(k) => k.sign(signed.as_bytes()).as_ref().to_vec(),
        };
        format!("{signed}.{}", b64(&sig))
    }
}

/// The DER prefix of a P-256 SubjectPublicKeyInfo (the 65-byte point follows).
fn p256_prefix() -> Vec<u8> {
    vec![
        0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08,
        0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
    ]
}

/// A JWKS document of `keys` (kid, key).
pub fn jwks_doc(keys: &[(&str, &TestKey)]) -> String {
    let keys: Vec<_> = keys.iter().map(|(kid, k)| k.jwk(kid)).collect();
    serde_json::json!({ "keys": keys }).to_string()
}

/// How the JWKS server answers.
#[derive(Clone, Debug, PartialEq)]
pub enum Mode {
    /// 200 with the current document.
    Serve,
    /// This status, no document.
    Fail(u16),
    /// Never answers (the connection stays open).
    Stall,
}

/// The JWKS server's state, changed by the test.
pub struct JwksServer {
    pub addr: SocketAddr,
    state: Arc<Mutex<(String, Mode)>>,
    hits: Arc<AtomicUsize>,
}

impl JwksServer {
    /// Serve `doc` over HTTP; `tls`: over HTTPS with this certificate and key.
    pub fn start(doc: String, tls: Option<Arc<rustls::ServerConfig>>) -> JwksServer {
        let std = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        std.set_nonblocking(true).unwrap();
        let addr = std.local_addr().unwrap();
        let state = Arc::new(Mutex::new((doc, Mode::Serve)));
        let hits = Arc::new(AtomicUsize::new(0));
        let (s, h) = (state.clone(), hits.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(serve(std, s, h, tls));
        });
        JwksServer { addr, state, hits }
    }

    pub fn url(&self) -> String {
        format!("http://{}/.well-known/jwks.json", self.addr)
    }

    pub fn set_doc(&self, doc: String) {
        self.state.lock().unwrap().0 = doc;
    }

    pub fn set_mode(&self, mode: Mode) {
        self.state.lock().unwrap().1 = mode;
    }

    /// Requests received so far.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

async fn serve(
    std: std::net::TcpListener,
    state: Arc<Mutex<(String, Mode)>>,
    hits: Arc<AtomicUsize>,
    tls: Option<Arc<rustls::ServerConfig>>,
) {
    let listener = tokio::net::TcpListener::from_std(std).unwrap();
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let (state, hits, acceptor) = (state.clone(), hits.clone(), acceptor.clone());
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |_req| {
                let (state, hits) = (state.clone(), hits.clone());
                async move {
                    hits.fetch_add(1, Ordering::SeqCst);
                    let (doc, mode) = state.lock().unwrap().clone();
                    let status = match mode {
                        Mode::Serve => 200,
                        Mode::Fail(s) => s,
                        Mode::Stall => std::future::pending().await,
                    };
                    let body = if status == 200 { doc } else { String::new() };
                    http::Response::builder()
                        .status(status)
                        .header("content-type", "application/json")
                        .body(Full::new(Bytes::from(body)))
                }
            });
            let http = hyper::server::conn::http1::Builder::new();
            match acceptor {
                None => {
                    let _ = http.serve_connection(TokioIo::new(tcp), svc).await;
                }
                Some(a) => {
                    if let Ok(s) = a.accept(tcp).await {
                        let _ = http.serve_connection(TokioIo::new(s), svc).await;
                    }
                }
            }
        });
    }
}
