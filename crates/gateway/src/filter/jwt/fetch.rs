//! One JWKS fetch: a GET over HTTP/1.1, cleartext or TLS (rustls with the ring provider;
//! roots from `ca` or the compiled-in Mozilla set). The whole exchange (name lookup,
//! connect, handshake, request and body) is bounded by `timeout` and the body by
//! `max_size`. Redirects are not followed.

use bytes::Bytes;
use http::header::{ACCEPT, HOST, USER_AGENT};
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, RootCertStore};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use keymaster_config::JwksConfig;

/// Why a fetch failed: the `result` label of `keymaster_jwks_fetches_total` and a message.
pub(super) type Failure = (&'static str, String);

/// A compiled `jwks` table's HTTP side.
pub(super) struct Fetcher {
    uri: Uri,
    /// `host:port` to connect to (IPv6 in brackets).
    authority: String,
    tls: Option<(TlsConnector, ServerName<'static>)>,
    timeout: Duration,
    max_size: usize,
}

impl Fetcher {
    /// Errors (an unreadable `ca` file) name the key.
    pub(super) fn new(c: &JwksConfig) -> Result<Fetcher, String> {
        let uri: Uri = c.url.parse().map_err(|e| format!("jwks.url: {e}"))?;
        let https = uri.scheme_str() == Some("https");
        let host = uri.host().ok_or("jwks.url: no host")?.to_string();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tls = if https {
            let bare = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let name = ServerName::try_from(bare).map_err(|e| format!("jwks.url: {e}"))?;
            Some((connector(c.ca.as_deref())?, name))
        } else {
            None
        };
        Ok(Fetcher {
            authority: format!("{host}:{port}"),
            uri,
            tls,
            timeout: c.timeout.get(),
            max_size: usize::try_from(c.max_size.get()).unwrap_or(usize::MAX),
        })
    }

    /// The document's bytes, or why not.
    pub(super) async fn fetch(&self) -> Result<Bytes, Failure> {
        match tokio::time::timeout(self.timeout, self.get()).await {
            Ok(r) => r,
            Err(_) => Err(("timeout", format!("no answer within {:?}", self.timeout))),
        }
    }

    async fn get(&self) -> Result<Bytes, Failure> {
        let tcp = TcpStream::connect(&self.authority)
            .await
            .map_err(|e| ("error", format!("connect {}: {e}", self.authority)))?;
        let _ = tcp.set_nodelay(true);
        match &self.tls {
            None => self.exchange(tcp).await,
            Some((connector, name)) => {
                let tls = connector
                    .connect(name.clone(), tcp)
                    .await
                    .map_err(|e| ("error", format!("TLS with {}: {e}", self.authority)))?;
                self.exchange(tls).await
            }
        }
    }

    /// One request on a fresh connection, driven here (no task outlives the fetch).
    async fn exchange<S>(&self, io: S) -> Result<Bytes, Failure>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let failed = |e: hyper::Error| ("error", e.to_string());
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
            .await
            .map_err(failed)?;
        let path = self.uri.path_and_query().map_or("/", |p| p.as_str());
        let request = Request::get(path)
            .header(HOST, self.uri.authority().map_or("", |a| a.as_str()))
            .header(ACCEPT, "application/json, application/jwk-set+json")
            .header(USER_AGENT, concat!("keymaster/", env!("CARGO_PKG_VERSION")))
            .body(Empty::<Bytes>::new())
            .map_err(|e| ("error", e.to_string()))?;
        let work = async {
            let response = send.send_request(request).await.map_err(failed)?;
            if response.status() != StatusCode::OK {
                return Err(("status", format!("HTTP {}", response.status())));
            }
            let body = Limited::new(response.into_body(), self.max_size);
            match body.collect().await {
                Ok(b) => Ok(b.to_bytes()),
                Err(e) if e.is::<http_body_util::LengthLimitError>() => Err((
                    "too_large",
                    format!("the document is over {} bytes", self.max_size),
                )),
                Err(e) => Err(("error", e.to_string())),
            }
        };
        tokio::pin!(work, conn);
        tokio::select! {
            r = &mut work => r,
            // The connection ended first: what it delivered is in the body already.
            _ = &mut conn => work.await,
        }
    }
}

/// A TLS client for HTTP/1.1 trusting `ca` (a PEM file) or the Mozilla roots.
fn connector(ca: Option<&str>) -> Result<TlsConnector, String> {
    let mut roots = RootCertStore::empty();
    match ca {
        Some(ca) => {
            for cert in crate::tls::read_certs(ca).map_err(|e| format!("jwks.ca: {e}"))? {
                roots
                    .add(cert)
                    .map_err(|e| format!("jwks.ca: {ca}: unusable CA certificate: {e}"))?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("jwks: TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsConnector::from(Arc::new(config)))
}
