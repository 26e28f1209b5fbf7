//! TLS for both transports: one rustls [`ClientConfig`] (ring provider, TLS 1.2 and 1.3) built
//! from material read at start-up, while the relay may still be privileged. Nothing here opens
//! a file: PEM bytes arrive in [`TlsMaterial`].

use std::sync::Arc;

use rustls::{
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    pki_types::{pem::PemObject as _, CertificateDer, PrivateKeyDer, ServerName, UnixTime},
    ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

use super::TransportError;

/// TLS inputs, read from files while the relay may still be privileged.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsMaterial {
    /// PEM CA certificates; `None`: the system store.
    pub ca_pem: Option<Vec<u8>>,
    /// PEM client certificate chain and key, for mutual TLS.
    pub client_cert_pem: Option<Vec<u8>>,
    pub client_key_pem: Option<Vec<u8>>,
    /// Accept any server certificate. Off by default; for tests and emergencies only.
    pub insecure_skip_verify: bool,
}

fn pem_error(what: &'static str) -> impl Fn(rustls::pki_types::pem::Error) -> TransportError {
    move |e| TransportError::Pem {
        what,
        reason: e.to_string(),
    }
}

/// The trusted roots: the `ca_file` PEM, else the system store.
fn roots(material: &TlsMaterial) -> Result<RootCertStore, TransportError> {
    let mut roots = RootCertStore::empty();
    match &material.ca_pem {
        Some(pem) => {
            for cert in CertificateDer::pem_slice_iter(pem) {
                roots.add(cert.map_err(pem_error("ca_file"))?)?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 && !material.insecure_skip_verify {
                // Only an error once TLS is actually used: callers build this lazily for https.
                return Err(TransportError::NoRoots);
            }
        }
    }
    if roots.is_empty() && !material.insecure_skip_verify {
        return Err(TransportError::Pem {
            what: "ca_file",
            reason: "no certificate in the file".into(),
        });
    }
    Ok(roots)
}

/// The rustls client configuration for `material` (ring provider, TLS 1.2 and 1.3).
pub fn client_config(material: &TlsMaterial) -> Result<ClientConfig, TransportError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots(material)?);
    let mut config = match (&material.client_cert_pem, &material.client_key_pem) {
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(pem_error("cert_file"))?;
            let key = PrivateKeyDer::from_pem_slice(key).map_err(pem_error("key_file"))?;
            builder.with_client_auth_cert(chain, key)?
        }
        _ => builder.with_no_client_auth(),
    };
    if material.insecure_skip_verify {
        config
            .dangerous()
            .set_certificate_verifier(Arc::new(SkipVerify(provider)));
    }
    Ok(config)
}

/// A configuration for a plaintext (`http://`) endpoint: the connectors need one, but it is
/// never used, so the system store is not loaded.
pub fn unused_config() -> Result<ClientConfig, TransportError> {
    Ok(
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(RootCertStore::empty())
            .with_no_client_auth(),
    )
}

/// Accepts any server certificate (still checks handshake signatures). `insecure_skip_verify`.
#[derive(Debug)]
struct SkipVerify(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for SkipVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
