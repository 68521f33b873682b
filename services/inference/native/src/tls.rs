//! TLS on the transport's port (rustls): a certificate chain and its key, and with a
//! client CA, mTLS: every client must present a certificate that CA signed, as grpc
//! core's server requires with `require_client_auth`. ALPN offers h2 alone, as gRPC
//! needs.

use std::fs::File;
use std::io::BufReader;
use std::sync::Arc;

use rustls_pemfile::Item;
use tokio_rustls::rustls::server::AllowAnyAuthenticatedClient;
use tokio_rustls::rustls::{Certificate, PrivateKey, RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;

/// The acceptor for PEM files `cert` (the chain) and `key`, requiring client
/// certificates signed by `client_ca` when given; the error names the file at fault.
pub fn acceptor(cert: &str, key: &str, client_ca: Option<&str>) -> Result<TlsAcceptor, String> {
    let chain = certificates(cert)?;
    let private_key = private_key(key)?;
    let builder = ServerConfig::builder().with_safe_defaults();
    let builder = match client_ca {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for certificate in certificates(ca)? {
                roots.add(&certificate).map_err(|e| format!("{ca}: {e}"))?;
            }
            builder.with_client_cert_verifier(AllowAnyAuthenticatedClient::new(roots))
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, private_key)
        .map_err(|e| format!("{cert} with {key}: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

fn certificates(path: &str) -> Result<Vec<Certificate>, String> {
    let file = File::open(path).map_err(|e| format!("{path}: {e}"))?;
    let certificates =
        rustls_pemfile::certs(&mut BufReader::new(file)).map_err(|e| format!("{path}: {e}"))?;
    if certificates.is_empty() {
        return Err(format!("{path}: no PEM certificate in it"));
    }
    Ok(certificates.into_iter().map(Certificate).collect())
}

fn private_key(path: &str) -> Result<PrivateKey, String> {
    let file = File::open(path).map_err(|e| format!("{path}: {e}"))?;
    let items =
        rustls_pemfile::read_all(&mut BufReader::new(file)).map_err(|e| format!("{path}: {e}"))?;
    items
        .into_iter()
        .find_map(|item| match item {
            Item::PKCS8Key(key) | Item::RSAKey(key) | Item::ECKey(key) => Some(PrivateKey(key)),
            _ => None,
        })
        .ok_or_else(|| format!("{path}: no PEM private key in it"))
}
