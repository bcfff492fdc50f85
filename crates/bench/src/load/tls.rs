//! TLS for the load generator (`https://` targets) and the bench's test certificate.
//!
//! Parity between systems is set here, on the client side: the generator offers exactly one
//! cipher suite (TLS 1.3 `TLS_AES_128_GCM_SHA256`) and one key exchange group (X25519), and
//! never resumes a session, so every new connection is a full handshake with the same
//! cryptography whichever server answers. The server certificate is one ECDSA P-256
//! certificate (rcgen) that every system is given.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::crypto::{ring, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// The cipher suite and group every TLS benchmark negotiates.
pub const TLS_PARITY: &str =
    "TLS 1.3, TLS_AES_128_GCM_SHA256, X25519, ECDSA P-256 certificate, no session resumption";

/// A configured TLS client: trust anchors from a CA file, the parity crypto, no resumption.
#[derive(Clone)]
pub struct TlsClient {
    connector: TlsConnector,
    name: ServerName<'static>,
}

impl std::fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsClient")
            .field("name", &self.name)
            .finish()
    }
}

impl TlsClient {
    /// Trust the CA certificates in `ca` (PEM); verify the server as `host`; offer `alpn`.
    pub fn new(ca: &Path, host: &str, alpn: &[&str]) -> Result<TlsClient, String> {
        let pem = std::fs::read(ca).map_err(|e| format!("{}: {e}", ca.display()))?;
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&pem) {
            let cert = cert.map_err(|e| format!("{}: {e}", ca.display()))?;
            roots
                .add(cert)
                .map_err(|e| format!("{}: {e}", ca.display()))?;
        }
        let base = ring::default_provider();
        let provider = CryptoProvider {
            cipher_suites: vec![ring::cipher_suite::TLS13_AES_128_GCM_SHA256],
            kx_groups: vec![ring::kx_group::X25519],
            ..base
        };
        let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
        cfg.resumption = rustls::client::Resumption::disabled();
        cfg.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
        let name = ServerName::try_from(host.to_owned()).map_err(|e| format!("{host}: {e}"))?;
        Ok(TlsClient {
            connector: TlsConnector::from(Arc::new(cfg)),
            name,
        })
    }

    /// The handshake over an open TCP connection.
    pub async fn connect(&self, tcp: TcpStream) -> io::Result<TlsStream<TcpStream>> {
        self.connector.connect(self.name.clone(), tcp).await
    }
}

/// A load-generator connection's byte stream.
#[derive(Debug)]
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// The files of the bench certificate in one directory.
#[derive(Debug, Clone)]
pub struct BenchCert {
    /// The CA certificate clients trust.
    pub ca: PathBuf,
    /// The server certificate (leaf only).
    pub cert: PathBuf,
    /// Its private key (PKCS#8).
    pub key: PathBuf,
    /// Certificate then key in one file (HAProxy's `crt`).
    pub combined: PathBuf,
}

/// Make a CA and an ECDSA P-256 server certificate for `localhost` and 127.0.0.1 in `dir`.
pub fn make_bench_cert(dir: &Path) -> Result<BenchCert, String> {
    let err = |e: rcgen::Error| e.to_string();
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(err)?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "keymaster bench CA");
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = rcgen::KeyPair::generate().map_err(err)?;
    let ca = ca_params.self_signed(&ca_key).map_err(err)?;
    let mut params =
        rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .map_err(err)?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "localhost");
    let key = rcgen::KeyPair::generate().map_err(err)?;
    let cert = params.signed_by(&key, &ca, &ca_key).map_err(err)?;
    let files = BenchCert {
        ca: dir.join("ca.pem"),
        cert: dir.join("cert.pem"),
        key: dir.join("key.pem"),
        combined: dir.join("combined.pem"),
    };
    let write =
        |p: &Path, s: String| std::fs::write(p, s).map_err(|e| format!("{}: {e}", p.display()));
    write(&files.ca, ca.pem())?;
    write(&files.cert, cert.pem())?;
    write(&files.key, key.serialize_pem())?;
    write(
        &files.combined,
        format!("{}{}", cert.pem(), key.serialize_pem()),
    )?;
    Ok(files)
}
