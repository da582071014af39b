//! A TLS client of the exporter for tests: a self-signed certificate for `localhost`, and a
//! client stream that trusts it and nothing else.

use std::io::{Read, Write};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;

/// A certificate for `localhost` and `127.0.0.1`, signed by its own key: `(certificate PEM, key
/// PEM)`.
///
/// # Panics
/// When the key or certificate cannot be made: the test's set-up failed.
#[allow(clippy::unwrap_used, reason = "test set-up: a failure there is the test failing")]
pub fn self_signed_localhost() -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
    let cert = params.self_signed(&key).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// A TLS client over `stream` (a TCP stream, or one that wraps it) to `localhost` that trusts `cert_pem` alone (the handshake happens
/// on the first read or write).
///
/// # Panics
/// When `cert_pem` is not a certificate: the test's set-up failed.
#[allow(clippy::unwrap_used, reason = "test set-up: a failure there is the test failing")]
pub fn tls_client<S: Read + Write>(
    cert_pem: &str,
    stream: S,
) -> rustls::StreamOwned<rustls::ClientConnection, S> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(rustls::pki_types::CertificateDer::from_pem_slice(cert_pem.as_bytes()).unwrap()).unwrap();
    let config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let connection = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    rustls::StreamOwned::new(connection, stream)
}
