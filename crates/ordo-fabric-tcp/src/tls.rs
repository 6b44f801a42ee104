//! Optional TLS (rustls) for the whole stream, for links across hosts.
//!
//! # Invariants
//! - **Mutual.** Both sides present a certificate chaining to the
//!   configured CA; the dialer checks the acceptor's certificate for the
//!   peer's IP address (a SAN), the acceptor requires a client
//!   certificate. TLS 1.2 and 1.3 only, rustls' safe defaults, the `ring`
//!   provider; no session tickets (a link lives long).
//! - **Under, not instead of, the secret.** The HELLO/PROOF handshake runs
//!   inside TLS as without it: TLS keeps on-path attackers from reading or
//!   altering frames, the cluster secret says who is a member.
//! - **One session per connection, behind the link's lock** once the
//!   connection is a link (the caller's thread encrypts when it posts, the
//!   I/O thread decrypts when it reads). Plaintext waiting in rustls is
//!   bounded by rustls' buffer limit, so posting still reports
//!   back-pressure instead of growing a buffer.
//! - Every socket read goes through [`read`] and every write through
//!   [`write`] when a session exists; no code touches a TLS socket raw.

use crate::fabric::TcpError;
use mio::net::TcpStream;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::io::{self, Read as _, Write as _};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

/// Certificates and keys for TLS links (see the module docs).
#[derive(Clone)]
pub struct TlsSettings {
    server: Arc<rustls::ServerConfig>,
    client: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsSettings { .. }")
    }
}

fn tls_err(what: &str, e: impl std::fmt::Display) -> TcpError {
    TcpError::Config(format!("TLS: {what}: {e}"))
}

impl TlsSettings {
    /// From PEM files: this member's certificate chain, its private key, and
    /// the CA certificate(s) every member's certificate chains to.
    pub fn from_pem_files(cert: &Path, key: &Path, ca: &Path) -> Result<TlsSettings, TcpError> {
        let chain = CertificateDer::pem_file_iter(cert)
            .map_err(|e| tls_err(&format!("reading {}", cert.display()), e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| tls_err(&format!("parsing {}", cert.display()), e))?;
        let key = PrivateKeyDer::from_pem_file(key)
            .map_err(|e| tls_err(&format!("reading {}", key.display()), e))?;
        let roots = CertificateDer::pem_file_iter(ca)
            .map_err(|e| tls_err(&format!("reading {}", ca.display()), e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| tls_err(&format!("parsing {}", ca.display()), e))?;
        Self::from_der(chain, key, roots)
    }

    /// From DER: this member's chain and key, and the CA certificates.
    pub fn from_der(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
        ca: Vec<CertificateDer<'static>>,
    ) -> Result<TlsSettings, TcpError> {
        if chain.is_empty() || ca.is_empty() {
            return Err(tls_err("certificates", "the certificate chain and the CA list must not be empty"));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for c in ca {
            roots.add(c).map_err(|e| tls_err("CA certificate", e))?;
        }
        let roots = Arc::new(roots);
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
                .build()
                .map_err(|e| tls_err("client verifier", e))?;
        let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_err("protocol versions", e))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| tls_err("certificate and key", e))?;
        server.send_tls13_tickets = 0;
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_err("protocol versions", e))?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(|e| tls_err("certificate and key", e))?;
        Ok(TlsSettings { server: Arc::new(server), client: Arc::new(client) })
    }

    /// A session for a connection we dialed to `peer`.
    pub(crate) fn dial(&self, peer: SocketAddr) -> io::Result<rustls::Connection> {
        let name = ServerName::IpAddress(peer.ip().into());
        let c = rustls::ClientConnection::new(self.client.clone(), name).map_err(io::Error::other)?;
        Ok(c.into())
    }

    /// A session for a connection we accepted.
    pub(crate) fn accept(&self) -> io::Result<rustls::Connection> {
        let c = rustls::ServerConnection::new(self.server.clone()).map_err(io::Error::other)?;
        Ok(c.into())
    }
}

/// Sends what the session has for the wire until the socket would block.
pub(crate) fn push(tls: &mut rustls::Connection, stream: &TcpStream) -> io::Result<()> {
    while tls.wants_write() {
        match tls.write_tls(&mut &*stream) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads plaintext: what the session holds, else what the socket brings.
/// `WouldBlock` only once the socket has nothing more (edge-triggered
/// polling needs that); `Ok(0)` at the peer's close.
pub(crate) fn read(tls: &mut rustls::Connection, stream: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match tls.reader().read(buf) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        match tls.read_tls(&mut &*stream) {
            Ok(0) => return Ok(0),
            Ok(_) => {
                let state = tls.process_new_packets().map_err(|e| {
                    // Tell the peer why, best effort.
                    let _ = push(tls, stream);
                    io::Error::new(io::ErrorKind::InvalidData, e)
                });
                let state = state?;
                // Handshake messages and alerts go out at once.
                push(tls, stream)?;
                if state.peer_has_closed() && state.plaintext_bytes_to_read() == 0 {
                    return Ok(0);
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// Takes as much of `bytes` as the session's buffer allows (0: full) and
/// pushes ciphertext to the socket.
pub(crate) fn write(tls: &mut rustls::Connection, stream: &TcpStream, bytes: &[u8]) -> io::Result<usize> {
    let n = tls.writer().write(bytes)?;
    push(tls, stream)?;
    Ok(n)
}
