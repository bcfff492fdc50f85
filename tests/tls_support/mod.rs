//! TLS test helpers: a throwaway CA and certificates made with rcgen in a tempdir, and real
//! rustls clients (HTTP/1.1 and h2 through hyper) to talk to the gateway.
#![allow(dead_code)]

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// A CA that signs server and client certificates, living in a tempdir.
pub struct Pki {
    pub dir: tempfile::TempDir,
    pub ca_cert: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
}

/// An issued certificate: its PEM files and its DER (to compare with what a peer presents).
pub struct Issued {
    pub cert_path: PathBuf,
    pub key_path: PathBuf,
    pub der: CertificateDer<'static>,
    pub key_der: PrivateKeyDer<'static>,
}

impl Pki {
    pub fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let (ca_cert, ca_key) = Self::make_ca("keymaster test CA");
        std::fs::write(dir.path().join("ca.pem"), ca_cert.pem()).unwrap();
        Pki {
            dir,
            ca_cert,
            ca_key,
        }
    }

    fn make_ca(cn: &str) -> (rcgen::Certificate, rcgen::KeyPair) {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        (cert, key)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn ca_path(&self) -> PathBuf {
        self.path("ca.pem")
    }

    /// Issue a certificate for `names` (DNS SANs) with subject CN `cn`, written to
    /// `<file>.pem` and `<file>.key` in the tempdir (overwriting: that is how tests rotate).
    pub fn issue(&self, file: &str, names: &[&str], cn: &str, client: bool) -> Issued {
        issue_with(
            &self.ca_cert,
            &self.ca_key,
            self.dir.path(),
            file,
            names,
            cn,
            client,
        )
    }

    /// A certificate signed by a different, unknown CA.
    pub fn issue_untrusted(&self, file: &str, names: &[&str], cn: &str, client: bool) -> Issued {
        let (ca, key) = Self::make_ca("somebody else's CA");
        issue_with(&ca, &key, self.dir.path(), file, names, cn, client)
    }

    pub fn roots(&self) -> rustls::RootCertStore {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca_cert.der().clone()).unwrap();
        roots
    }
}

fn issue_with(
    ca: &rcgen::Certificate,
    ca_key: &rcgen::KeyPair,
    dir: &Path,
    file: &str,
    names: &[&str],
    cn: &str,
    client: bool,
) -> Issued {
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let mut params = rcgen::CertificateParams::new(names).unwrap();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    params.extended_key_usages = vec![if client {
        rcgen::ExtendedKeyUsagePurpose::ClientAuth
    } else {
        rcgen::ExtendedKeyUsagePurpose::ServerAuth
    }];
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, ca, ca_key).unwrap();
    let cert_path = dir.join(format!("{file}.pem"));
    let key_path = dir.join(format!("{file}.key"));
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    Issued {
        cert_path,
        key_path,
        der: cert.der().clone(),
        key_der: PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
    }
}

/// Options for a test client.
pub struct ClientOpts {
    pub versions: Vec<&'static rustls::SupportedProtocolVersion>,
    pub alpn: Vec<&'static str>,
    pub sni: bool,
    pub client_cert: Option<(CertificateDer<'static>, PrivateKeyDer<'static>)>,
}

impl Default for ClientOpts {
    fn default() -> Self {
        ClientOpts {
            versions: vec![&rustls::version::TLS13, &rustls::version::TLS12],
            alpn: vec!["http/1.1"],
            sni: true,
            client_cert: None,
        }
    }
}

pub fn client_config(pki: &Pki, opts: &ClientOpts) -> Arc<rustls::ClientConfig> {
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&opts.versions)
    .unwrap()
    .with_root_certificates(pki.roots());
    let mut cfg = match &opts.client_cert {
        Some((cert, key)) => builder
            .with_client_auth_cert(vec![cert.clone()], key.clone_key())
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    cfg.alpn_protocols = opts.alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
    cfg.enable_sni = opts.sni;
    Arc::new(cfg)
}

/// TLS-connect to `addr`, verifying the server as `name`.
pub async fn connect(
    addr: SocketAddr,
    name: &str,
    cfg: Arc<rustls::ClientConfig>,
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let connector = tokio_rustls::TlsConnector::from(cfg);
    let server_name = ServerName::try_from(name.to_string()).unwrap();
    connector.connect(server_name, tcp).await
}

/// The leaf certificate the server presented.
pub fn peer_leaf(s: &TlsStream<TcpStream>) -> CertificateDer<'static> {
    s.get_ref()
        .1
        .peer_certificates()
        .expect("server certificate")[0]
        .clone()
}

pub fn negotiated_alpn(s: &TlsStream<TcpStream>) -> Option<Vec<u8>> {
    s.get_ref().1.alpn_protocol().map(|p| p.to_vec())
}

/// A response as a test sees it.
#[derive(Debug)]
pub struct TlsReply {
    pub status: u16,
    pub version: http::Version,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

/// HTTP/1.1 keep-alive client over an established TLS stream.
pub struct H1 {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
}

impl H1 {
    pub async fn handshake(s: TlsStream<TcpStream>) -> hyper::Result<H1> {
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s)).await?;
        tokio::spawn(conn);
        Ok(H1 { sender })
    }

    pub async fn get(&mut self, path: &str, headers: &[(&str, &str)]) -> hyper::Result<TlsReply> {
        let mut req = http::Request::get(path).header("host", "gw.test");
        for (n, v) in headers {
            req = req.header(*n, *v);
        }
        self.sender.ready().await?;
        let resp = self
            .sender
            .send_request(req.body(Full::new(Bytes::new())).unwrap())
            .await?;
        collect(resp).await
    }
}

/// HTTP/2 client over an established TLS stream (ALPN h2).
pub async fn h2(
    s: TlsStream<TcpStream>,
) -> hyper::Result<hyper::client::conn::http2::SendRequest<Full<Bytes>>> {
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(s)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

pub async fn h2_get(
    sender: &mut hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    path: &str,
) -> hyper::Result<TlsReply> {
    let req = http::Request::get(format!("https://gw.test{path}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    sender.ready().await?;
    let resp = sender.send_request(req).await?;
    collect(resp).await
}

async fn collect(resp: http::Response<hyper::body::Incoming>) -> hyper::Result<TlsReply> {
    let (parts, body) = resp.into_parts();
    let body = body.collect().await?.to_bytes();
    Ok(TlsReply {
        status: parts.status.as_u16(),
        version: parts.version,
        headers: parts.headers,
        body,
    })
}

/// Every value of request header `name` the stub origin saw (from a `/__inspect` body).
pub fn inspected(body: &[u8], name: &str) -> Vec<String> {
    let j: serde_json::Value = serde_json::from_slice(body).expect("inspect json");
    j["headers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h[0].as_str().unwrap().eq_ignore_ascii_case(name))
        .map(|h| h[1].as_str().unwrap().to_string())
        .collect()
}

/// The listener keys for TLS with `certs` (cert, key) and any extra TLS keys.
pub fn tls_keys(certs: &[&Issued], extra: &str) -> String {
    let list: Vec<String> = certs
        .iter()
        .map(|c| {
            format!(
                "{{ cert = \"{}\", key = \"{}\" }}",
                c.cert_path.display(),
                c.key_path.display()
            )
        })
        .collect();
    let sep = if extra.is_empty() { "" } else { ", " };
    format!(
        "tls = {{ certificates = [{}]{sep}{extra} }}",
        list.join(", ")
    )
}
