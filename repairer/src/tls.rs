//! TLS on the repairer's listener (rustls). The certificate and key are read at start and again
//! on SIGHUP or when either file changes (looked at every few seconds), so a renewed certificate
//! is served without a restart; a pair that does not load (half-written, a key that does not
//! match) is logged and the pair served before stays.
//!
//! Handshakes run on each connection's own task (`fleetmend_listener`), under the deadline of the
//! first request's head (`listener.header_timeout`), so a client that connects and says nothing
//! holds no one else up. A client that speaks plain HTTP to the TLS port is answered with a
//! plain-text 400 saying to use https, and the connection is closed.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use serde::Deserialize;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

/// `[tls]` of the repairer's config.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// The certificate chain, PEM, the repairer's own certificate first.
    pub cert: PathBuf,
    /// Its private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// No longer used: the handshake runs under `listener.header_timeout`. Read only to name the
    /// replacement when a config still sets it.
    #[serde(default, with = "humantime_serde::option")]
    pub handshake_timeout: Option<Duration>,
}

/// How often the certificate's files are looked at for a change.
const WATCH_EVERY: Duration = Duration::from_secs(5);

/// The certificate and key could not be served.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {message}")]
    Read { path: PathBuf, message: String },
    #[error("{path} holds no certificate")]
    NoCertificate { path: PathBuf },
    #[error("the key {key} cannot be used: {message}")]
    Key { key: PathBuf, message: String },
    #[error("the key {key} does not belong to the certificate {cert}: {message}")]
    Mismatch { cert: PathBuf, key: PathBuf, message: String },
}

/// The pair being served, swapped when the files change.
#[derive(Debug)]
pub struct Certificates {
    config: TlsConfig,
    current: RwLock<Loaded>,
}

#[derive(Debug)]
struct Loaded {
    key: Arc<CertifiedKey>,
    stamps: (Option<SystemTime>, Option<SystemTime>),
}

impl Certificates {
    /// Loads the pair named in `config`; an error here stops the repairer from starting.
    pub fn load(config: &TlsConfig) -> Result<Arc<Certificates>, TlsError> {
        let stamps = stamps(config);
        let key = Arc::new(load_pair(&config.cert, &config.key)?);
        Ok(Arc::new(Certificates {
            config: config.clone(),
            current: RwLock::new(Loaded { key, stamps }),
        }))
    }

    /// Reads the pair again if `forced` or either file changed since it was read; returns
    /// whether a new pair is now served. A pair that fails to load leaves the old one.
    pub fn reload(&self, forced: bool) -> Result<bool, TlsError> {
        let now = stamps(&self.config);
        let seen = self.current.read().map(|l| l.stamps).unwrap_or_default();
        if !forced && now == seen {
            return Ok(false);
        }
        let loaded = load_pair(&self.config.cert, &self.config.key);
        let mut current = self.current.write().unwrap_or_else(|p| p.into_inner());
        // Not tried again until the files change once more (or SIGHUP).
        current.stamps = now;
        current.key = Arc::new(loaded?);
        Ok(true)
    }

    /// Reloads on SIGHUP and when the files change, until the process ends.
    pub fn watch(self: Arc<Self>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut hangup =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
            loop {
                let forced = tokio::select! {
                    _ = tokio::time::sleep(WATCH_EVERY) => false,
                    Some(()) = async { match hangup.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => true,
                };
                match self.reload(forced) {
                    Ok(true) => {
                        tracing::info!(cert = %self.config.cert.display(), "TLS certificate read again")
                    }
                    Ok(false) => {}
                    Err(err) => {
                        tracing::error!(error = %err, "TLS certificate not read again: the one read before is served")
                    }
                }
            }
        })
    }

    /// A rustls server config serving whatever pair is current.
    pub fn server_config(self: &Arc<Self>) -> Arc<rustls::ServerConfig> {
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map(|b| b.with_no_client_auth().with_cert_resolver(self.clone()))
        .unwrap_or_else(|_| {
            rustls::ServerConfig::builder().with_no_client_auth().with_cert_resolver(self.clone())
        });
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    }
}

impl ResolvesServerCert for Certificates {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.read().ok().map(|l| l.key.clone())
    }
}

fn stamps(config: &TlsConfig) -> (Option<SystemTime>, Option<SystemTime>) {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    (modified(&config.cert), modified(&config.key))
}

fn load_pair(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    let read = |path: &Path, err: rustls::pki_types::pem::Error| TlsError::Read {
        path: path.to_owned(),
        message: err.to_string(),
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| read(cert, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| read(cert, e))?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate { path: cert.to_owned() });
    }
    let private = PrivateKeyDer::from_pem_file(key).map_err(|e| read(key, e))?;
    let provider = rustls::crypto::ring::default_provider();
    let signing = provider
        .key_provider
        .load_private_key(private)
        .map_err(|e| TlsError::Key { key: key.to_owned(), message: e.to_string() })?;
    let pair = CertifiedKey::new(chain, signing);
    pair.keys_match().map_err(|e| TlsError::Mismatch {
        cert: cert.to_owned(),
        key: key.to_owned(),
        message: e.to_string(),
    })?;
    Ok(pair)
}

/// The TLS handshake of each connection the listener accepts (run on the connection's own task,
/// under the header deadline).
#[derive(Clone)]
pub struct TlsHandshake {
    acceptor: tokio_rustls::TlsAcceptor,
}

impl std::fmt::Debug for TlsHandshake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsHandshake").finish_non_exhaustive()
    }
}

impl TlsHandshake {
    pub fn new(config: Arc<rustls::ServerConfig>) -> TlsHandshake {
        TlsHandshake { acceptor: tokio_rustls::TlsAcceptor::from(config) }
    }
}

impl fleetmend_listener::Handshake for TlsHandshake {
    type Io = TlsStream<TcpStream>;

    async fn handshake(
        &self,
        stream: TcpStream,
        peer: SocketAddr,
    ) -> std::io::Result<Option<TlsStream<TcpStream>>> {
        let shaken = handshake(&self.acceptor, stream).await;
        if matches!(shaken, Ok(None)) {
            tracing::debug!(%peer, "plain HTTP on the TLS port: told to use https");
        }
        shaken
    }
}

/// The handshake, or `None` when the client spoke plain HTTP (answered with a 400).
async fn handshake(
    acceptor: &tokio_rustls::TlsAcceptor,
    mut stream: TcpStream,
) -> std::io::Result<Option<TlsStream<TcpStream>>> {
    let mut first = [0u8; 1];
    // A TLS client opens with a handshake record (0x16); an HTTP request with a method's letter.
    if stream.peek(&mut first).await? == 1 && first[0].is_ascii_uppercase() {
        let body = "this repairer speaks TLS: use https://\n";
        let answer = format!(
            "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(answer.as_bytes()).await?;
        stream.shutdown().await?;
        return Ok(None);
    }
    acceptor.accept(stream).await.map(Some)
}
