//! Inbound TLS termination (rustls, ring provider).
//!
//! Each TLS listener holds a [`ListenerTls`]: an `ArcSwap` of its compiled [`TlsSettings`]
//! (the rustls `ServerConfig` plus the mTLS identity header). A handshake loads the current
//! settings once, so a reload (which re-reads every PEM file and swaps the settings) affects
//! new handshakes only; established connections keep what they negotiated.
//!
//! Certificates are chosen by SNI against the DNS names in each certificate's
//! subjectAltName (exact, then a `*.` wildcard one label deep); the first certificate is the
//! default when the client sends no SNI or an unknown name.

use arc_swap::ArcSwap;
use http::header::HeaderName;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use rustls_pki_types::CertificateDer;
use std::collections::HashMap;
use std::sync::Arc;

use keymaster_config::{ListenerConfig, ListenerProtocol, TlsConfig, TlsVersion};
use keymaster_http::pem::{ca_roots, read_certs, read_key};

/// A listener's TLS state, swapped whole on reload.
pub(crate) struct ListenerTls {
    pub(crate) current: ArcSwap<TlsSettings>,
}

/// One compiled version of a listener's TLS settings.
pub(crate) struct TlsSettings {
    pub(crate) server_config: Arc<ServerConfig>,
    /// Header that carries the verified client identity upstream (mTLS), if configured.
    pub(crate) identity_header: Option<HeaderName>,
}

impl ListenerTls {
    pub(crate) fn new(settings: TlsSettings) -> Self {
        ListenerTls {
            current: ArcSwap::from_pointee(settings),
        }
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Read and compile the TLS settings of listener `index` (for error messages) from its config.
/// Every file is read now; errors name the config key and the file.
pub(crate) fn build(
    index: usize,
    protocol: ListenerProtocol,
    tls: &TlsConfig,
) -> Result<TlsSettings, String> {
    let at = format!("listeners[{index}].tls");
    let provider = provider();
    let mut resolver = SniResolver::default();
    for (j, c) in tls.certificates.iter().enumerate() {
        let cat = format!("{at}.certificates[{j}]");
        let chain = read_certs(&c.cert).map_err(|e| format!("{cat}.cert: {e}"))?;
        let key = read_key(&c.key).map_err(|e| format!("{cat}.key: {e}"))?;
        let signer = provider
            .key_provider
            .load_private_key(key)
            .map_err(|e| format!("{cat}.key: {}: unusable private key: {e}", c.key))?;
        let ck = CertifiedKey::new(chain, signer);
        ck.keys_match().map_err(|e| {
            format!(
                "{cat}: the key in {} does not match the certificate in {}: {e}",
                c.key, c.cert
            )
        })?;
        let leaf = webpki::EndEntityCert::try_from(&ck.cert[0])
            .map_err(|e| format!("{cat}.cert: {}: unparsable certificate: {e}", c.cert))?;
        let names: Vec<String> = leaf
            .valid_dns_names()
            .map(|n| n.to_ascii_lowercase())
            .collect();
        resolver.add(Arc::new(ck), names);
    }
    let versions: &[&rustls::SupportedProtocolVersion] = match tls.min_version {
        TlsVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        TlsVersion::Tls13 => &[&rustls::version::TLS13],
    };
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .map_err(|e| format!("{at}.min_version: {e}"))?;
    let (builder, identity_header) = match &tls.client_auth {
        None => (builder.with_no_client_auth(), None),
        Some(ca) => {
            let cat = format!("{at}.client_auth");
            let roots = ca_roots(&ca.ca, |_| {}).map_err(|e| format!("{cat}.ca: {e}"))?;
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = if ca.required {
                verifier.build()
            } else {
                verifier.allow_unauthenticated().build()
            }
            .map_err(|e| format!("{cat}.ca: {}: {e}", ca.ca))?;
            let header = match &ca.forward_header {
                Some(h) => Some(
                    HeaderName::from_bytes(h.as_bytes())
                        .map_err(|e| format!("{cat}.forward_header: {e}"))?,
                ),
                None => None,
            };
            (builder.with_client_cert_verifier(verifier), header)
        }
    };
    let mut config = builder.with_cert_resolver(Arc::new(resolver));
    config.alpn_protocols = tls
        .effective_alpn(protocol)
        .iter()
        .map(|p| p.as_bytes().to_vec())
        .collect();
    Ok(TlsSettings {
        server_config: Arc::new(config),
        identity_header,
    })
}

/// For a reload: new settings for every running TLS listener, read from `listeners` (the new
/// config) by name. A listener that lost or gained `tls` needs a restart: it keeps running
/// as it is (with a warning). Any unreadable file fails the whole reload.
#[allow(clippy::type_complexity)]
pub(crate) fn rebuild(
    running: &[(String, Arc<ListenerTls>)],
    listeners: &[ListenerConfig],
) -> Result<Vec<(Arc<ListenerTls>, TlsSettings)>, String> {
    let mut out = Vec::new();
    for (name, tls) in running {
        // A listener gone from the new config needs a restart too (warned about by the caller).
        if let Some((i, l)) = listeners.iter().enumerate().find(|(_, l)| &l.name == name) {
            match &l.tls {
                Some(t) => out.push((tls.clone(), build(i, l.protocol, t)?)),
                None => tracing::warn!(
                    listener = %name,
                    "reload: turning TLS off takes effect on restart; keeping TLS"
                ),
            }
        }
    }
    for l in listeners {
        if l.tls.is_some() && !running.iter().any(|(n, _)| n == &l.name) {
            tracing::warn!(listener = %l.name, "reload: turning TLS on takes effect on restart");
        }
    }
    Ok(out)
}

/// Certificates by SNI name; index 0 is the default.
#[derive(Debug, Default)]
struct SniResolver {
    certs: Vec<Arc<CertifiedKey>>,
    exact: HashMap<String, usize>,
    /// "*.example.com" is stored as "example.com".
    wildcard: HashMap<String, usize>,
}

impl SniResolver {
    fn add(&mut self, ck: Arc<CertifiedKey>, names: Vec<String>) {
        let i = self.certs.len();
        self.certs.push(ck);
        for n in names {
            // Earlier certificates win for a name listed twice.
            match n.strip_prefix("*.") {
                Some(suffix) => self.wildcard.entry(suffix.to_string()).or_insert(i),
                None => self.exact.entry(n).or_insert(i),
            };
        }
    }

    fn pick(&self, sni: Option<&str>) -> Option<Arc<CertifiedKey>> {
        let i = sni
            .map(|s| s.trim_end_matches('.').to_ascii_lowercase())
            .and_then(|s| {
                self.exact.get(&s).copied().or_else(|| {
                    let (_, parent) = s.split_once('.')?;
                    self.wildcard.get(parent).copied()
                })
            })
            .unwrap_or(0);
        self.certs.get(i).cloned()
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.pick(hello.server_name())
    }
}

/// The identity of a verified client certificate: subject CN, else its first DNS name.
pub(crate) fn client_identity(leaf: &CertificateDer<'_>) -> Option<String> {
    let cert = webpki::EndEntityCert::try_from(leaf).ok()?;
    common_name(cert.subject())
        .or_else(|| cert.valid_dns_names().next().map(str::to_string))
        .filter(|s| http::HeaderValue::from_str(s).is_ok())
}

/// Read one DER TLV: (tag, contents, rest).
fn tlv(data: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = data.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (first as usize, rest)
    } else {
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n].iter().fold(0usize, |a, &b| (a << 8) | b as usize);
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

/// The last commonName (OID 2.5.4.3) in a DER Name's contents (RDNSequence without its
/// outer SEQUENCE header, as webpki returns it).
fn common_name(mut rdns: &[u8]) -> Option<String> {
    const CN: &[u8] = &[0x55, 0x04, 0x03];
    let mut found = None;
    while let Some((_, set, rest)) = tlv(rdns) {
        rdns = rest;
        let mut atvs = set;
        while let Some((_, atv, rest)) = tlv(atvs) {
            atvs = rest;
            let Some((0x06, oid, value)) = tlv(atv) else {
                continue;
            };
            if oid == CN {
                if let Some((_, v, _)) = tlv(value) {
                    found = std::str::from_utf8(v).ok().map(str::to_string);
                }
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls_pki_types::PrivateKeyDer;

    #[test]
    fn common_name_of_generated_cert() {
        let mut params = rcgen::CertificateParams::new(vec!["svc.example".into()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "Org");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "client-7");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(client_identity(cert.der()).as_deref(), Some("client-7"));
        // No CN: the first DNS name.
        let mut params = rcgen::CertificateParams::new(vec!["svc.example".into()]).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(client_identity(cert.der()).as_deref(), Some("svc.example"));
    }

    #[test]
    fn sni_picks_exact_then_wildcard_then_default() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mk = |names: Vec<String>| {
            let cert = rcgen::CertificateParams::new(names)
                .unwrap()
                .self_signed(&key)
                .unwrap();
            let signer = provider()
                .key_provider
                .load_private_key(PrivateKeyDer::try_from(key.serialize_der()).unwrap())
                .unwrap();
            Arc::new(CertifiedKey::new(vec![cert.der().clone()], signer))
        };
        let mut r = SniResolver::default();
        let a = mk(vec!["a.example".into()]);
        let b = mk(vec!["*.b.example".into(), "b.example".into()]);
        r.add(a.clone(), vec!["a.example".into()]);
        r.add(b.clone(), vec!["*.b.example".into(), "b.example".into()]);
        assert!(Arc::ptr_eq(&r.pick(Some("A.Example")).unwrap(), &a));
        assert!(Arc::ptr_eq(&r.pick(Some("x.b.example")).unwrap(), &b));
        assert!(Arc::ptr_eq(&r.pick(Some("b.example")).unwrap(), &b));
        assert!(Arc::ptr_eq(&r.pick(Some("y.x.b.example")).unwrap(), &a));
        assert!(Arc::ptr_eq(&r.pick(None).unwrap(), &a));
    }
}
