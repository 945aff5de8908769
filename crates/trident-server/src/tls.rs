//! TLS for both front ends, on rustls with the ring provider: gRPC with Triton's
//! `--grpc-use-ssl*` flags (through tonic), and HTTPS, which Triton does not have
//! (`--http-use-ssl*`). Certificates and keys are PEM files, read once at start; a
//! file that cannot be read or parsed stops the server with its path in the error.

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where a service's certificate, key and (for mutual TLS) client CA are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The server's certificate chain (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// With mutual TLS: the CA that client certificates must chain to (PEM). Clients
    /// without a valid certificate are refused during the handshake.
    pub client_ca: Option<PathBuf>,
}

fn read(path: &Path, what: &str) -> std::io::Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| std::io::Error::new(e.kind(), format!("{what} {}: {e}", path.display())))
}

fn invalid(path: &Path, what: &str, e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!("{what} {}: {e}", path.display()),
    )
}

/// The certificates in PEM bytes; none is an error.
fn parse_certificates(pem: &[u8], path: &Path, what: &str) -> std::io::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(path, what, e))?;
    if certs.is_empty() {
        return Err(invalid(path, what, "no PEM certificate in the file"));
    }
    Ok(certs)
}

fn certificates(path: &Path, what: &str) -> std::io::Result<Vec<CertificateDer<'static>>> {
    parse_certificates(&read(path, what)?, path, what)
}

/// The PEM bytes tonic takes.
pub(crate) struct Pem {
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
    pub client_ca: Option<Vec<u8>>,
}

impl TlsFiles {
    /// The files' PEM bytes, each checked to parse.
    pub(crate) fn pem(&self) -> std::io::Result<Pem> {
        // Each file read once and parsed here, so a bad file is named before tonic sees it.
        let cert = read(&self.cert, "--grpc-server-cert")?;
        parse_certificates(&cert, &self.cert, "--grpc-server-cert")?;
        let key = read(&self.key, "--grpc-server-key")?;
        PrivateKeyDer::from_pem_slice(&key).map_err(|e| invalid(&self.key, "--grpc-server-key", e))?;
        let client_ca = match &self.client_ca {
            Some(p) => {
                let ca = read(p, "--grpc-root-cert")?;
                parse_certificates(&ca, p, "--grpc-root-cert")?;
                Some(ca)
            }
            None => None,
        };
        Ok(Pem { cert, key, client_ca })
    }

    /// A rustls acceptor for HTTPS (HTTP/1.1 over TLS 1.2 or 1.3).
    pub(crate) fn acceptor(&self) -> std::io::Result<tokio_rustls::TlsAcceptor> {
        use tokio_rustls::rustls;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certs = certificates(&self.cert, "--http-server-cert")?;
        let key_pem = read(&self.key, "--http-server-key")?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem)
            .map_err(|e| invalid(&self.key, "--http-server-key", e))?;
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid(&self.cert, "TLS", e))?;
        let builder = match &self.client_ca {
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in certificates(ca, "--http-root-cert")? {
                    roots.add(cert).map_err(|e| invalid(ca, "--http-root-cert", e))?;
                }
                let verifier =
                    rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|e| invalid(ca, "--http-root-cert", e))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(certs, key)
            .map_err(|e| invalid(&self.key, "--http-server-key", e))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
    }
}
