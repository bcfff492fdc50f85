//! TLS for `ctx.http`'s `https://` URLs (rustls, ring provider): the server's certificate
//! must chain to `[lua] http_ca_file` (PEM) or, without it, to the Mozilla roots compiled
//! into the gateway (webpki-roots), and name the URL's host (sent as SNI; an IP address is
//! checked against the certificate's IP addresses and sent without SNI). ALPN offers
//! `http/1.1`.

use keymaster_http::pem::client_roots;
use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// The compiled trust settings of one config version.
pub(crate) struct Trust {
    connector: TlsConnector,
    /// A hash of the trust anchors (the CA file's certificates, or the built-in roots):
    /// part of the pool key, so a changed CA file never reuses connections verified
    /// against the old one.
    pub id: u64,
}

impl Trust {
    /// Trust `ca_file`'s certificates, or the built-in roots. Errors name the key.
    pub(crate) fn new(ca_file: Option<&str>) -> Result<Trust, String> {
        let mut id = DefaultHasher::new();
        let roots = client_roots(ca_file, |anchor| anchor.hash(&mut id))
            .map_err(|e| format!("lua.http_ca_file: {e}"))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("lua: TLS client: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Trust {
            connector: TlsConnector::from(Arc::new(config)),
            id: id.finish().max(1),
        })
    }

    /// The TLS handshake with `host` over `tcp`; the error says why it failed.
    pub(crate) async fn handshake(
        &self,
        host: &str,
        tcp: TcpStream,
    ) -> Result<TlsStream<TcpStream>, String> {
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| format!("{host:?} is not usable as a TLS server name: {e}"))?;
        self.connector
            .connect(name, tcp)
            .await
            .map_err(|e| match e.get_ref() {
                Some(inner) => inner.to_string(),
                None => e.to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_file_that_is_missing_or_not_pem_names_the_key_and_the_path() {
        let e = Trust::new(Some("/nonexistent/ca.pem"))
            .err()
            .expect("missing");
        assert!(
            e.starts_with("lua.http_ca_file: cannot read /nonexistent/ca.pem"),
            "{e}"
        );
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ca.pem");
        std::fs::write(&p, "not a certificate\n").unwrap();
        let e = Trust::new(Some(p.to_str().unwrap())).err().expect("no PEM");
        assert!(e.contains("no certificate found"), "{e}");
    }

    #[test]
    fn the_built_in_roots_are_the_default() {
        let a = Trust::new(None).expect("webpki roots");
        let b = Trust::new(None).expect("webpki roots");
        assert_eq!(a.id, b.id, "same anchors, same pool key");
    }
}
