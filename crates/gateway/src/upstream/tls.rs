//! Outbound TLS to origin servers (rustls, ring provider), per cluster.
//!
//! A cluster with a `tls` table compiles one [`UpstreamTls`]: the rustls `ClientConfig`
//! (roots from the configured CA file or the compiled-in Mozilla roots, optional client
//! certificate, TLS versions, ALPN from the cluster's protocol) and an identity digest over
//! everything that decides who the gateway talks to and how it proves itself. The digest is
//! part of every origin server's pool key ([`super::OriginKey`]), so connections are never
//! shared between different server names, trust anchors, client certificates or protocols,
//! and a reload that changes any of them (even a file's content) opens new connections.

use ring::digest;
use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use std::sync::Arc;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use keymaster_config::{TlsVersion, UpstreamProtocol, UpstreamTlsConfig};
use keymaster_http::pem::{client_roots, read_certs, read_key};

/// One cluster's compiled outbound TLS settings.
pub(crate) struct UpstreamTls {
    connector: TlsConnector,
    /// The configured `sni`, or `None` to use each server's host.
    sni: Option<ServerName<'static>>,
    /// SHA-256 over the settings and the bytes of every file they name.
    pub(crate) digest: [u8; 32],
}

impl std::fmt::Debug for UpstreamTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamTls")
            .field("sni", &self.sni)
            .finish_non_exhaustive()
    }
}

/// Read the files and compile the TLS settings of cluster `name`. Errors name the key.
pub(crate) fn build(
    name: &str,
    cfg: &UpstreamTlsConfig,
    protocol: UpstreamProtocol,
) -> Result<UpstreamTls, String> {
    let at = format!("cluster {name}: tls");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut id = digest::Context::new(&digest::SHA256);
    let roots = client_roots(cfg.ca.as_deref(), |anchor| {
        id.update(b"ca:");
        id.update(anchor);
    })
    .map_err(|e| format!("{at}.ca: {e}"))?;
    let versions: &[&rustls::SupportedProtocolVersion] = match (cfg.min_version, cfg.max_version) {
        (TlsVersion::Tls12, TlsVersion::Tls13) => {
            &[&rustls::version::TLS13, &rustls::version::TLS12]
        }
        (TlsVersion::Tls12, TlsVersion::Tls12) => &[&rustls::version::TLS12],
        (TlsVersion::Tls13, _) => &[&rustls::version::TLS13],
    };
    for v in versions {
        id.update(format!("version:{:?}", v.version).as_bytes());
    }
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .map_err(|e| format!("{at}.min_version: {e}"))?
        .with_root_certificates(roots);
    let mut config = match &cfg.client_cert {
        None => builder.with_no_client_auth(),
        Some(c) => {
            let chain = read_certs(&c.cert).map_err(|e| format!("{at}.client_cert.cert: {e}"))?;
            let key = read_key(&c.key).map_err(|e| format!("{at}.client_cert.key: {e}"))?;
            for cert in &chain {
                id.update(b"client:");
                id.update(cert);
            }
            id.update(key.secret_der());
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("{at}.client_cert: {}: {e}", c.key))?
        }
    };
    config.alpn_protocols = match protocol {
        UpstreamProtocol::Http1 => vec![b"http/1.1".to_vec()],
        UpstreamProtocol::H2 => vec![b"h2".to_vec()],
        UpstreamProtocol::Auto => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
    };
    for p in &config.alpn_protocols {
        id.update(b"alpn:");
        id.update(p);
    }
    let sni = match &cfg.sni {
        Some(s) => {
            Some(ServerName::try_from(s.clone()).map_err(|e| format!("{at}.sni: {s:?}: {e}"))?)
        }
        None => None,
    };
    let mut out = [0u8; 32];
    out.copy_from_slice(id.finish().as_ref());
    Ok(UpstreamTls {
        connector: TlsConnector::from(Arc::new(config)),
        sni,
        digest: out,
    })
}

impl UpstreamTls {
    /// The name to send in SNI and verify for a server written as `address` ("host:port"):
    /// the configured `sni`, else the address's host. An IP address is verified against the
    /// certificate's IP SANs and sent without SNI (rustls never sends an IP as SNI).
    pub(crate) fn server_name(&self, address: &str) -> Result<ServerName<'static>, String> {
        if let Some(n) = &self.sni {
            return Ok(n.clone());
        }
        let host = match address.rsplit_once(':') {
            Some((h, _)) => h,
            None => address,
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        ServerName::try_from(host.to_string())
            .map_err(|e| format!("{host:?} is not usable as a TLS server name: {e}"))
    }

    /// The TLS handshake over an open TCP connection. Returns the stream and whether ALPN
    /// chose h2.
    pub(crate) async fn handshake(
        &self,
        name: ServerName<'static>,
        tcp: TcpStream,
    ) -> std::io::Result<(TlsStream<TcpStream>, bool)> {
        let tls = self.connector.connect(name, tcp).await?;
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
        Ok((tls, h2))
    }
}
