//! A private PKI made with the `openssl` CLI in a temp dir: two unrelated CAs, server
//! certificates for loopback and for another name, and client certificates.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The name only [`ServerCert::Named`] is valid for.
pub const NAMED_HOST: &str = "redis.internal";

/// Which certificate a TLS server presents (both signed by [`Pki::ca`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerCert {
    /// `server.pem`: valid for `localhost` and `127.0.0.1`.
    Loopback,
    /// `named.pem`: valid for [`NAMED_HOST`] only, so dialing 127.0.0.1 fails verification.
    Named,
}

/// Certificates and keys in a temp dir, removed on drop. EC P-256 keys (fast to make), written
/// as PKCS#8 unless the accessor says otherwise; the servers run as the same user, so they read
/// the keys however private they are.
pub struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    /// Makes every file at once (a few dozen milliseconds of `openssl`).
    pub fn new() -> Self {
        let me = Self {
            dir: tempfile::tempdir().unwrap(),
        };
        me.make_ca("ca", "delay-bridge test CA");
        me.make_ca("other-ca", "delay-bridge unrelated CA");
        me.leaf(
            "server",
            "localhost",
            "serverAuth",
            "subjectAltName = DNS:localhost, IP:127.0.0.1",
        );
        me.leaf(
            "named",
            NAMED_HOST,
            "serverAuth",
            &format!("subjectAltName = DNS:{NAMED_HOST}"),
        );
        me.leaf("client", "delay-bridge test client", "clientAuth", "");
        // The same client key as SEC1 (`BEGIN EC PRIVATE KEY`).
        me.openssl(&["ec", "-in", "client.key", "-out", "client-sec1.key"]);
        // An RSA client whose key is PKCS#1 (`BEGIN RSA PRIVATE KEY`).
        me.openssl(&["genrsa", "-traditional", "-out", "client-rsa.key", "2048"]);
        me.sign(
            "client-rsa",
            "delay-bridge test RSA client",
            "clientAuth",
            "",
        );
        for key in ["client.key", "client-sec1.key", "client-rsa.key"] {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(me.path(key), std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        me
    }

    /// A file of the PKI by name (`ca.pem`, `client.key`, ...).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The directory holding every file.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `ca.pem`: the CA that signed every server and client certificate.
    pub fn ca(&self) -> PathBuf {
        self.path("ca.pem")
    }

    /// `other-ca.pem`: a CA that signed nothing here.
    pub fn other_ca(&self) -> PathBuf {
        self.path("other-ca.pem")
    }

    /// A server certificate (chain of one) and its key.
    pub fn server(&self, which: ServerCert) -> (PathBuf, PathBuf) {
        let name = match which {
            ServerCert::Loopback => "server",
            ServerCert::Named => "named",
        };
        (
            self.path(&format!("{name}.pem")),
            self.path(&format!("{name}.key")),
        )
    }

    /// `client.pem`: the EC client certificate.
    pub fn client_cert(&self) -> PathBuf {
        self.path("client.pem")
    }

    /// `client.key`: its key as PKCS#8, mode 0600.
    pub fn client_key(&self) -> PathBuf {
        self.path("client.key")
    }

    /// `client-sec1.key`: the same key as SEC1.
    pub fn client_key_sec1(&self) -> PathBuf {
        self.path("client-sec1.key")
    }

    /// `client-rsa.pem` and `client-rsa.key` (PKCS#1): an RSA client certificate.
    pub fn client_rsa(&self) -> (PathBuf, PathBuf) {
        (self.path("client-rsa.pem"), self.path("client-rsa.key"))
    }

    /// A self-signed CA `NAME.pem` with its key `NAME.key`.
    fn make_ca(&self, name: &str, cn: &str) {
        self.new_key(name);
        self.openssl(&[
            "req",
            "-x509",
            "-new",
            "-key",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.pem"),
            "-days",
            "2",
            "-subj",
            &format!("/CN={cn}"),
            "-addext",
            "basicConstraints = critical, CA:TRUE",
            "-addext",
            "keyUsage = critical, keyCertSign, cRLSign",
        ]);
    }

    /// A new EC key `NAME.key` and `NAME.pem` signed by the CA.
    fn leaf(&self, name: &str, cn: &str, purpose: &str, san: &str) {
        self.new_key(name);
        self.sign(name, cn, purpose, san);
    }

    /// `NAME.pem` for the existing `NAME.key`, signed by the CA for `purpose` (an extended
    /// key usage) with the `san` extension line, if any.
    fn sign(&self, name: &str, cn: &str, purpose: &str, san: &str) {
        let ext = format!(
            "basicConstraints = critical, CA:FALSE\n\
             keyUsage = critical, digitalSignature\n\
             extendedKeyUsage = {purpose}\n{san}\n"
        );
        std::fs::write(self.path(&format!("{name}.ext")), ext).unwrap();
        self.openssl(&[
            "req",
            "-new",
            "-key",
            &format!("{name}.key"),
            "-subj",
            &format!("/CN={cn}"),
            "-out",
            &format!("{name}.csr"),
        ]);
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &format!("{name}.ext"),
            "-out",
            &format!("{name}.pem"),
        ]);
    }

    /// An EC P-256 key `NAME.key` (PKCS#8).
    fn new_key(&self, name: &str) {
        self.openssl(&[
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
            &format!("{name}.key"),
        ]);
    }

    /// `openssl ARGS...` in the PKI's dir; panics with its output if it fails.
    fn openssl(&self, args: &[&str]) {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .expect("the openssl CLI must be installed (see README)");
        super::assert_success(&out, &format!("openssl {args:?}: "));
    }
}

impl Default for Pki {
    fn default() -> Self {
        Self::new()
    }
}
