//! The `jsonwebtoken` crate's signature checks, done with `ring` (the crypto library rustls
//! uses here): the crate parses tokens, keys and claims; this provider verifies signatures.
//! It is installed as the crate's process-wide provider before the first filter compiles.
//! Signing is not offered (the gateway only verifies).

use jsonwebtoken::crypto::{CryptoProvider, JwkUtils, JwtSigner, JwtVerifier};
use jsonwebtoken::errors::{ErrorKind, Result};
use jsonwebtoken::{Algorithm, DecodingKey, DecodingKeyKind, EncodingKey};
use ring::{hmac, signature as sig};

static PROVIDER: CryptoProvider = CryptoProvider {
    signer_factory: no_signer,
    verifier_factory: verifier,
    jwk_utils: JwkUtils::new_unimplemented(),
};

/// Make this provider the crate's (idempotent; a provider installed earlier stays and is
/// reported once).
pub(super) fn install() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if PROVIDER.install_default().is_err() {
            tracing::warn!("jsonwebtoken already has a crypto provider; the jwt filter uses it");
        }
    });
}

fn no_signer(_: &Algorithm, _: &EncodingKey) -> Result<Box<dyn JwtSigner>> {
    Err(ErrorKind::Signing("the gateway does not sign tokens".into()).into())
}

fn verifier(alg: &Algorithm, key: &DecodingKey) -> Result<Box<dyn JwtVerifier>> {
    if !alg_fits(*alg, key) {
        return Err(ErrorKind::InvalidAlgorithm.into());
    }
    Ok(Box::new(RingVerifier {
        alg: *alg,
        key: key.clone(),
    }))
}

/// Whether `alg` belongs to the key's family (no HMAC with a public key, no RSA with an EC
/// key, ...).
pub(super) fn alg_fits(alg: Algorithm, key: &DecodingKey) -> bool {
    key.family().algorithms().contains(&alg)
}

struct RingVerifier {
    alg: Algorithm,
    key: DecodingKey,
}

impl JwtVerifier for RingVerifier {
    fn algorithm(&self) -> Algorithm {
        self.alg
    }
}

impl signature::Verifier<Vec<u8>> for RingVerifier {
    fn verify(&self, msg: &[u8], signature: &Vec<u8>) -> std::result::Result<(), signature::Error> {
        if check(self.alg, &self.key, msg, signature) {
            Ok(())
        } else {
            Err(signature::Error::new())
        }
    }
}

/// The RSA parameters of an RS or PS algorithm.
fn rsa(alg: Algorithm) -> Option<&'static sig::RsaParameters> {
    Some(match alg {
        Algorithm::RS256 => &sig::RSA_PKCS1_2048_8192_SHA256,
        Algorithm::RS384 => &sig::RSA_PKCS1_2048_8192_SHA384,
        Algorithm::RS512 => &sig::RSA_PKCS1_2048_8192_SHA512,
        Algorithm::PS256 => &sig::RSA_PSS_2048_8192_SHA256,
        Algorithm::PS384 => &sig::RSA_PSS_2048_8192_SHA384,
        Algorithm::PS512 => &sig::RSA_PSS_2048_8192_SHA512,
        _ => return None,
    })
}

fn check(alg: Algorithm, key: &DecodingKey, msg: &[u8], signature: &[u8]) -> bool {
    let hmac = |h| hmac::verify(&hmac::Key::new(h, key.as_bytes()), msg, signature).is_ok();
    let public = |a: &'static dyn sig::VerificationAlgorithm| {
        sig::UnparsedPublicKey::new(a, key.as_bytes())
            .verify(msg, signature)
            .is_ok()
    };
    match alg {
        Algorithm::HS256 => hmac(hmac::HMAC_SHA256),
        Algorithm::HS384 => hmac(hmac::HMAC_SHA384),
        Algorithm::HS512 => hmac(hmac::HMAC_SHA512),
        Algorithm::ES256 => public(&sig::ECDSA_P256_SHA256_FIXED),
        Algorithm::ES384 => public(&sig::ECDSA_P384_SHA384_FIXED),
        Algorithm::EdDSA => public(&sig::ED25519),
        _ => match (rsa(alg), key.kind()) {
            (Some(p), DecodingKeyKind::RsaModulusExponent { n, e }) => {
                sig::RsaPublicKeyComponents { n, e }
                    .verify(p, msg, signature)
                    .is_ok()
            }
            (Some(p), DecodingKeyKind::SecretOrDer(der)) => sig::UnparsedPublicKey::new(p, der)
                .verify(msg, signature)
                .is_ok(),
            (None, _) => false,
        },
    }
}
