//! Certificates, private keys and trust anchors read from PEM files, for every TLS server
//! and client of the gateway (listeners, origins, configuration sources, Lua's `ctx.http`).
//! Errors name the file and say what is wrong with it; callers put the config key in front.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::RootCertStore;

/// The certificates in PEM file `path`, in order; at least one.
pub fn read_certs(path: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let data = std::fs::read(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    let certs = CertificateDer::pem_slice_iter(&data)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{path}: bad PEM: {e}"))?;
    if certs.is_empty() {
        return Err(format!(
            "{path}: no certificate found; expected PEM \"-----BEGIN CERTIFICATE-----\" blocks"
        ));
    }
    Ok(certs)
}

/// The first private key in PEM file `path`.
pub fn read_key(path: &str) -> Result<PrivateKeyDer<'static>, String> {
    let data = std::fs::read(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    PrivateKeyDer::from_pem_slice(&data).map_err(|e| {
        format!("{path}: no usable private key ({e}); expected a PEM PKCS#8, PKCS#1 or SEC1 key")
    })
}

/// The trust anchors in CA file `path`: every certificate in it must be usable as one.
/// `anchor` sees each certificate's DER bytes, so a caller can fingerprint what it trusts.
pub fn ca_roots(path: &str, mut anchor: impl FnMut(&[u8])) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for cert in read_certs(path)? {
        anchor(&cert);
        roots
            .add(cert)
            .map_err(|e| format!("{path}: unusable CA certificate: {e}"))?;
    }
    Ok(roots)
}

/// What a TLS client trusts: CA file `ca`'s certificates, or without one the Mozilla roots
/// compiled into the gateway (webpki-roots). `anchor` sees each CA certificate's DER bytes,
/// or `b"webpki-roots"` once for the built-in set.
pub fn client_roots(
    ca: Option<&str>,
    mut anchor: impl FnMut(&[u8]),
) -> Result<RootCertStore, String> {
    match ca {
        Some(path) => ca_roots(path, anchor),
        None => {
            anchor(b"webpki-roots");
            let mut roots = RootCertStore::empty();
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
            Ok(roots)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_that_are_missing_empty_or_not_certificates_say_so() {
        let e = read_certs("/nonexistent/ca.pem").unwrap_err();
        assert!(e.starts_with("cannot read /nonexistent/ca.pem"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ca.pem");
        std::fs::write(&p, "not a certificate\n").unwrap();
        let path = p.to_str().unwrap();
        assert!(read_certs(path)
            .unwrap_err()
            .contains("no certificate found"));
        assert!(read_key(path)
            .unwrap_err()
            .contains("no usable private key"));
        let e = client_roots(Some(path), |_| {}).expect_err("no anchors");
        assert!(e.contains("no certificate found"), "{e}");
    }

    #[test]
    fn a_ca_file_s_certificates_are_the_anchors() {
        let ca = rcgen::generate_simple_self_signed(vec!["ca.test".into()]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ca.pem");
        std::fs::write(&p, ca.cert.pem()).unwrap();
        let mut seen = Vec::new();
        let roots = client_roots(Some(p.to_str().unwrap()), |a| seen.push(a.to_vec())).unwrap();
        assert_eq!(roots.len(), 1);
        assert_eq!(seen, vec![ca.cert.der().to_vec()]);
    }

    #[test]
    fn without_a_ca_file_the_built_in_roots_are_trusted() {
        let mut seen = Vec::new();
        let roots = client_roots(None, |a| seen.push(a.to_vec())).unwrap();
        assert!(roots.len() > 100, "{} roots", roots.len());
        assert_eq!(seen, vec![b"webpki-roots".to_vec()]);
    }
}
