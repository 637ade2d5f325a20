//! TLS client settings for Redis and RabbitMQ: trusted CAs, a client certificate and the name to verify, read from files.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use serde::{Deserialize, Serialize};

/// `[redis.tls]`, `[sinks.NAME.tls]`: TLS client settings. The files are read when the
/// configuration is validated (into the [`Tls`] client its section keeps), never logged.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM file with the CA certificates to trust instead of the system's (a private CA).
    pub ca_file: Option<PathBuf>,
    /// PEM file with the client certificate (and its chain), for servers that require one.
    /// Needs `key_file`.
    pub cert_file: Option<PathBuf>,
    /// PEM file with the client certificate's private key (PKCS#8, PKCS#1 or SEC1). Keep it
    /// readable by the bridge's user only: a key readable by group or others is warned about.
    pub key_file: Option<PathBuf>,
    /// The name the server's certificate must carry, where the URL's host is not that name
    /// (an IP address, a load balancer, a tunnel). Also sent as SNI.
    pub server_name: Option<String>,
    /// Accept any certificate from any server: no verification at all, so anyone on the path
    /// can read and change messages. Only for trying things out; warned at start and by
    /// `check`. Excludes `ca_file`; `server_name` is then only sent as SNI.
    #[serde(default)]
    pub insecure: bool,
}

/// A TLS client ready to connect: the rustls configuration and the name to verify.
#[derive(Clone)]
pub struct Tls {
    config: Arc<ClientConfig>,
    server_name: Option<String>,
    client_certificate: bool,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

/// Why a TLS table cannot be used: the field at fault and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsProblem {
    /// `ca_file`, `cert_file`, `key_file` or `server_name`.
    pub field: &'static str,
    /// What is wrong, naming the file.
    pub message: String,
}

impl Tls {
    /// Reads the files of `settings` (or the system's trust store without `ca_file`) into a
    /// client configuration. Every problem is reported, not just the first.
    pub fn new(settings: &TlsConfig) -> Result<Self, Vec<TlsProblem>> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut problems = Vec::new();
        let roots = match &settings.ca_file {
            Some(path) => match read_certs(path) {
                Ok(certs) => {
                    let mut roots = RootCertStore::empty();
                    let (_, ignored) = roots.add_parsable_certificates(certs);
                    if roots.is_empty() {
                        problems.push(problem(
                            "ca_file",
                            format!("{}: no usable CA certificate", path.display()),
                        ));
                    } else if ignored > 0 {
                        tracing::warn!(file = %path.display(), ignored, "CA file: some certificates cannot be used and are ignored");
                    }
                    roots
                }
                Err(why) => {
                    problems.push(problem("ca_file", why));
                    RootCertStore::empty()
                }
            },
            None => system_roots(),
        };
        let identity = match (&settings.cert_file, &settings.key_file) {
            (Some(cert), Some(key)) => {
                let chain = read_certs(cert).map_err(|why| problem("cert_file", why));
                let key = read_key(key).map_err(|why| problem("key_file", why));
                match (chain, key) {
                    (Ok(chain), Ok(key)) => Some((chain, key)),
                    (chain, key) => {
                        problems.extend(chain.err());
                        problems.extend(key.err());
                        None
                    }
                }
            }
            (Some(_), None) => {
                problems.push(problem("key_file", "required with cert_file".into()));
                None
            }
            (None, Some(_)) => {
                problems.push(problem("cert_file", "required with key_file".into()));
                None
            }
            (None, None) => None,
        };
        if let Some(name) = &settings.server_name {
            if ServerName::try_from(name.as_str()).is_err() {
                problems.push(problem(
                    "server_name",
                    format!("`{name}` is not a valid DNS name or IP address"),
                ));
            }
        }
        if settings.insecure && settings.ca_file.is_some() {
            problems.push(problem(
                "insecure",
                "verifies nothing, so ca_file would be ignored: remove one or the other".into(),
            ));
        }
        if let Some((chain, key)) = &identity {
            // Checked here, with the other problems, rather than when the config is built.
            if let Err(e) = CertifiedKey::from_der(chain.clone(), key.clone_key(), &provider) {
                let why = match e {
                    rustls::Error::InconsistentKeys(_) => {
                        "is not the private key of cert_file's certificate".to_string()
                    }
                    e => format!("cannot be used: {e}"),
                };
                problems.push(problem("key_file", why));
            }
        }
        if !problems.is_empty() {
            return Err(problems);
        }

        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_root_certificates(roots);
        let mut config = match identity {
            Some((chain, key)) => builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| vec![problem("key_file", format!("does not fit cert_file: {e}"))])?,
            None => builder.with_no_client_auth(),
        };
        if settings.insecure {
            config
                .dangerous()
                .set_certificate_verifier(Arc::new(AcceptAnyCertificate(provider)));
        }
        Ok(Self {
            config: Arc::new(config),
            server_name: settings.server_name.clone(),
            client_certificate: settings.cert_file.is_some(),
        })
    }

    /// Verification against the system's trust store and the URL's host name.
    pub fn system() -> Self {
        Self::new(&TlsConfig::default()).expect("no files to read")
    }

    /// Whether the bridge presents a client certificate.
    pub fn has_client_certificate(&self) -> bool {
        self.client_certificate
    }

    /// The rustls configuration.
    pub fn config(&self) -> Arc<ClientConfig> {
        self.config.clone()
    }

    /// The name to verify for a server reached at `host`: `server_name` if set, else `host`.
    pub fn name_for<'a>(&'a self, host: &'a str) -> &'a str {
        self.server_name.as_deref().unwrap_or(host)
    }
}

fn problem(field: &'static str, message: String) -> TlsProblem {
    TlsProblem { field, message }
}

/// What an operator should hear about `settings` before it is used: verification turned off,
/// a private key others can read.
pub(crate) fn warnings(settings: &TlsConfig) -> Vec<String> {
    let mut out = Vec::new();
    if settings.insecure {
        out.push(
            "insecure = true: the server's certificate is not verified, anyone on the path can \
             read and change messages"
                .to_string(),
        );
    }
    if let Some(key) = &settings.key_file {
        if let Some(mode) = shared_mode(key) {
            out.push(format!(
                "key_file {} is readable by group or others (mode {mode:o}): `chmod 600` it",
                key.display()
            ));
        }
    }
    out
}

/// The file's permission bits if group or others may read it.
pub(crate) fn shared_mode(path: &Path) -> Option<u32> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
        (mode & 0o044 != 0).then_some(mode)
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        None
    }
}

fn read(path: &PathBuf) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

fn read_certs(path: &PathBuf) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: not a PEM certificate file: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: holds no PEM certificate", path.display()));
    }
    Ok(certs)
}

fn read_key(path: &PathBuf) -> Result<PrivateKeyDer<'static>, String> {
    let pem = read(path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        format!(
            "{}: no PEM private key (PKCS#8, PKCS#1 or SEC1): {e}",
            path.display()
        )
    })
}

/// The operating system's CA certificates; an empty store (every server refused, with an
/// "unknown issuer" error naming the endpoint) where there are none.
fn system_roots() -> RootCertStore {
    let mut roots = RootCertStore::empty();
    match rustls_native_certs::load_native_certs() {
        Ok(certs) => {
            roots.add_parsable_certificates(certs);
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot load the system's CA certificates: set tls.ca_file")
        }
    }
    roots
}

/// The verifier of `insecure = true`: any certificate, any name. The handshake's signatures
/// are checked against whatever certificate the peer sends, which proves nothing about who
/// the peer is: anyone on the path can present a certificate of their own.
#[derive(Debug)]
struct AcceptAnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAnyCertificate {
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
        verify_tls12_signature(
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
        verify_tls13_signature(
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
