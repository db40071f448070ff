//! HTTPS on the same listener: rustls 0.23 on the `ring` provider (the one the webhook client
//! already uses), accepted with tokio-rustls and served by the same hyper connection builder
//! as plain HTTP (so the edge's limits hold alike). PEM files are read with
//! `rustls-pki-types` (`rustls-pemfile` is unmaintained).
//!
//! Certificates are reloaded without a restart, on SIGHUP and when the files change (checked
//! every [`RELOAD_CHECK`]): new connections get the new configuration, open ones keep theirs. A
//! reload that fails (a half-written file, a key that does not match) keeps the old one.
//!
//! mTLS: with `--tls-client-ca`, a client must present a certificate that CA signed, or the
//! handshake fails. A certificate proves the machine, not a role: requests still need a token
//! for their scopes (mapping certificate subjects to scopes would put an X.509 parser on the
//! request path, and tokens already name each client).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::RwLock;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;

/// How often the certificate files are checked for changes.
pub const RELOAD_CHECK: Duration = Duration::from_secs(2);

/// Where the PEM files are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Clients must present a certificate signed by one of these (mTLS).
    pub client_ca: Option<PathBuf>,
}

/// The TLS configuration in force, reloadable.
#[derive(Debug)]
pub struct Tls {
    files: TlsFiles,
    config: RwLock<Arc<ServerConfig>>,
    /// Modification times of the files the configuration was built from.
    loaded: RwLock<Vec<Option<SystemTime>>>,
}

impl Tls {
    /// Reads the files; an error says which and why.
    pub fn load(files: TlsFiles) -> Result<Self, String> {
        let config = build(&files)?;
        let loaded = modified(&files);
        Ok(Self {
            files,
            config: RwLock::new(Arc::new(config)),
            loaded: RwLock::new(loaded),
        })
    }

    /// An acceptor with the configuration in force now.
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(Arc::clone(&self.config.read()))
    }

    /// Reads the files again; on an error the configuration in force stays.
    pub fn reload(&self) -> Result<(), String> {
        let stamps = modified(&self.files);
        let config = build(&self.files)?;
        *self.config.write() = Arc::new(config);
        *self.loaded.write() = stamps;
        Ok(())
    }

    /// Whether a file changed since the configuration was built.
    pub fn changed(&self) -> bool {
        modified(&self.files) != *self.loaded.read()
    }

    /// Reloads whenever the files change, until dropped.
    pub async fn watch_files(self: Arc<Self>) {
        loop {
            tokio::time::sleep(RELOAD_CHECK).await;
            if !self.changed() {
                continue;
            }
            match self.reload() {
                Ok(()) => {
                    tracing::info!("TLS certificate files changed: reloaded for new connections")
                }
                Err(error) => {
                    // Mark them seen, so a broken file is reported once, not every check.
                    *self.loaded.write() = modified(&self.files);
                    tracing::error!(%error, "TLS files changed but cannot be used: the old certificate stays")
                }
            }
        }
    }
}

fn modified(files: &TlsFiles) -> Vec<Option<SystemTime>> {
    [
        Some(&files.cert),
        Some(&files.key),
        files.client_ca.as_ref(),
    ]
    .into_iter()
    .flatten()
    .map(|path| {
        std::fs::metadata(path)
            .and_then(|meta| meta.modified())
            .ok()
    })
    .collect()
}

fn build(files: &TlsFiles) -> Result<ServerConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs = read_certs(&files.cert)?;
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|error| format!("{}: no usable private key ({error})", files.key.display()))?;
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|error| error.to_string())?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = RootCertStore::empty();
            for cert in read_certs(path)? {
                roots
                    .add(cert)
                    .map_err(|error| format!("{}: {error}", path.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|error| format!("{}: {error}", path.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(certs, key).map_err(|error| {
        format!(
            "{} and {}: {error}",
            files.cert.display(),
            files.key.display()
        )
    })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|error| format!("{}: {error}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate", path.display()));
    }
    Ok(certs)
}
