//! Private servers on free loopback ports, for tests that configure, stop or restart them
//! without touching the shared ones: `redis-server` and a RabbitMQ node, either also over TLS.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::tls::{Pki, ServerCert};
use super::{free_port, kill, poll, unique};

/// Polls until a TCP connect to `port` succeeds (`up`) or fails (`!up`), up to `timeout`.
pub async fn wait_port(port: u16, up: bool, timeout: Duration) -> bool {
    poll(
        timeout,
        Duration::from_millis(50),
        async || {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
        },
        |open| *open == up,
    )
    .await
    .0
}

/// A `redis-server` child with its data and log in a temp dir; killed on drop.
pub struct RedisServer {
    /// Its port on 127.0.0.1 (the TLS port of a TLS server, which has no other).
    pub port: u16,
    /// The server program: `redis-server`, or another engine's (Valkey's `valkey-server`).
    binary: PathBuf,
    args: Vec<String>,
    /// Set for a TLS server: what the test's own clients trust and present.
    tls: Option<TlsClient>,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

/// The files a test's own client of a TLS server uses: the CA and a client certificate
/// (presented whether or not the server asks for one).
struct TlsClient {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

impl RedisServer {
    /// Starts one without persistence, with `extra` arguments (e.g. `--requirepass`,
    /// `--maxmemory`), and waits until it answers.
    pub async fn start(extra: &[&str]) -> Self {
        let mut args = vec!["--appendonly", "no"];
        args.extend_from_slice(extra);
        Self::start_with(&args, None).await
    }

    /// Starts one that speaks TLS only (`--port 0`), presenting `cert` of `pki` and trusting
    /// `pki`'s CA for client certificates, which it demands if `require_client_cert`; waits
    /// until it answers `redis-cli --tls`. [`RedisServer::url`] is then `rediss://`.
    pub async fn start_tls(pki: &Pki, cert: ServerCert, require_client_cert: bool) -> Self {
        let (server_cert, server_key) = pki.server(cert);
        let (server_cert, server_key, ca) = (
            path_arg(&server_cert),
            path_arg(&server_key),
            path_arg(&pki.ca()),
        );
        let auth = if require_client_cert { "yes" } else { "no" };
        let args = [
            "--appendonly",
            "no",
            "--tls-cert-file",
            &server_cert,
            "--tls-key-file",
            &server_key,
            "--tls-ca-cert-file",
            &ca,
            "--tls-auth-clients",
            auth,
        ];
        let client = TlsClient {
            ca: pki.ca(),
            cert: pki.client_cert(),
            key: pki.client_key(),
        };
        Self::start_with(&args, Some(client)).await
    }

    /// Starts one with `appendonly yes` (fsync every second), so that [`RedisServer::shutdown`]
    /// and [`RedisServer::restart`] keep the data, and waits until it answers.
    pub async fn append_only() -> Self {
        Self::start_with(&["--appendonly", "yes", "--appendfsync", "everysec"], None).await
    }

    /// Starts `binary` (another engine's server, e.g. `valkey-server`) as [`RedisServer::start`]
    /// starts `redis-server`.
    pub async fn start_binary(binary: &Path, extra: &[&str]) -> Self {
        let mut args = vec!["--appendonly", "no"];
        args.extend_from_slice(extra);
        let mut me = Self::unstarted(&args, None);
        me.binary = binary.to_path_buf();
        me.spawn().await;
        me
    }

    fn unstarted(args: &[&str], tls: Option<TlsClient>) -> Self {
        Self {
            port: free_port(),
            binary: PathBuf::from("redis-server"),
            args: args.iter().map(|a| a.to_string()).collect(),
            tls,
            dir: tempfile::tempdir().unwrap(),
            child: None,
        }
    }

    async fn start_with(args: &[&str], tls: Option<TlsClient>) -> Self {
        let mut me = Self::unstarted(args, tls);
        me.spawn().await;
        me
    }

    async fn spawn(&mut self) {
        let dir = self.dir.path();
        let port = self.port.to_string();
        let ports = match self.tls {
            Some(_) => vec!["--port", "0", "--tls-port", &port],
            None => vec!["--port", &port],
        };
        let child = Command::new(&self.binary)
            .args(["--bind", "127.0.0.1"])
            .args(ports)
            .args(["--save", ""])
            .arg("--dir")
            .arg(dir)
            .arg("--logfile")
            .arg(dir.join("redis.log"))
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (see README)");
        self.child = Some(child);
        // Any data command fails with LOADING until the AOF is replayed; with --requirepass
        // it answers NOAUTH: up all the same.
        let (up, _) = poll(
            Duration::from_secs(20),
            Duration::from_millis(50),
            async || {
                if self.tls.is_some() {
                    // No plain port to probe; redis-cli does not check the name, so a server
                    // with a certificate for another name answers too.
                    return self
                        .cli(&["PING"])
                        .await
                        .is_ok_and(|out| out.trim() == "PONG");
                }
                let Ok(mut c) = self.try_conn().await else {
                    return false;
                };
                let r: redis::RedisResult<i64> = redis::cmd("DBSIZE").query_async(&mut c).await;
                r.is_ok() || matches!(&r, Err(e) if e.code() == Some("NOAUTH"))
            },
            |up| *up,
        )
        .await;
        assert!(up, "private redis-server did not start: {}", self.log());
    }

    async fn try_conn(&self) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        let client = match &self.tls {
            None => redis::Client::open(self.url())?,
            Some(tls) => {
                let read = |p: &Path| std::fs::read(p).unwrap();
                redis::Client::build_with_tls(
                    self.url(),
                    redis::TlsCertificates {
                        client_tls: Some(redis::ClientTlsConfig {
                            client_cert: read(&tls.cert),
                            client_key: read(&tls.key),
                        }),
                        root_cert: Some(read(&tls.ca)),
                    },
                )?
            }
        };
        super::connect(&client).await
    }

    /// `redis://127.0.0.1:PORT/0`, or `rediss://` for a TLS server.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}/0", self.port)
    }

    /// Runs `redis-cli ARGS...` against it (over TLS with the CA and client certificate for a
    /// TLS server: the chain is checked, the name is not) off the async threads; its stdout
    /// if it exited 0, else stdout and stderr.
    pub async fn cli(&self, args: &[&str]) -> Result<String, String> {
        let mut cmd = Command::new("redis-cli");
        cmd.args(["-h", "127.0.0.1", "-p", &self.port.to_string()]);
        if let Some(tls) = &self.tls {
            cmd.arg("--tls")
                .arg("--cacert")
                .arg(&tls.ca)
                .arg("--cert")
                .arg(&tls.cert)
                .arg("--key")
                .arg(&tls.key);
        }
        cmd.args(args);
        let out = tokio::task::spawn_blocking(move || cmd.stdin(Stdio::null()).output())
            .await
            .unwrap()
            .expect("redis-cli must be installed (see README)");
        super::stdout_if_success(&out)
    }

    /// Its address, for a proxy in front of it.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// A connection straight to it (not through any proxy), without credentials; over TLS
    /// with the client certificate for a TLS server, which must then present
    /// [`ServerCert::Loopback`] (use [`RedisServer::cli`] for the other).
    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        self.try_conn().await.expect("private redis answers")
    }

    /// `SHUTDOWN` (an AOF is flushed first) and waits for the process to exit.
    pub async fn shutdown(&mut self) {
        if self.tls.is_some() {
            // The server closes the connection instead of replying.
            let _ = self.cli(&["SHUTDOWN"]).await;
        } else if let Ok(mut c) = self.try_conn().await {
            // The server closes the connection instead of replying.
            let _: redis::RedisResult<()> = redis::cmd("SHUTDOWN").query_async(&mut c).await;
        }
        let mut child = self.child.take().expect("running");
        let (exited, _) = poll(
            Duration::from_secs(10),
            Duration::from_millis(20),
            async || child.try_wait().unwrap().is_some(),
            |exited| *exited,
        )
        .await;
        if !exited {
            let _ = child.kill();
            let _ = child.wait();
            panic!("redis-server ignored SHUTDOWN: {}", self.log());
        }
    }

    /// SIGKILLs it (no shutdown, nothing flushed) and reaps it.
    pub fn sigkill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port, arguments and data directory.
    pub async fn restart(&mut self) {
        assert!(self.child.is_none(), "shut it down first");
        self.spawn().await;
    }

    /// The server's log file.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A RabbitMQ node of its own (name, ports, data and logs in a temp dir, no plugins), so it
/// can be stopped and started without touching the shared broker. Stopped on drop.
pub struct RabbitServer {
    /// AMQP port on 127.0.0.1.
    pub port: u16,
    /// AMQPS port on 127.0.0.1, when started with [`RabbitServer::start_tls`].
    tls_port: Option<u16>,
    dist_port: u16,
    node: String,
    dir: tempfile::TempDir,
    running: bool,
    /// Started with a shared cookie, as a cluster member.
    clustered: bool,
}

/// Where the real `rabbitmq-server` and `rabbitmqctl` scripts live. Debian's `/usr/sbin`
/// wrappers switch to the rabbitmq user and drop the environment, so prefer the library dir.
fn rabbit_bin(name: &str) -> PathBuf {
    if let Ok(dir) = std::env::var("DELAY_BRIDGE_TEST_RABBITMQ_BIN") {
        return Path::new(&dir).join(name);
    }
    let debian = Path::new("/usr/lib/rabbitmq/bin").join(name);
    if debian.exists() {
        debian
    } else {
        PathBuf::from(name)
    }
}

impl RabbitServer {
    /// Starts a detached node and waits until it takes AMQP clients (a few seconds).
    pub async fn start() -> Self {
        Self::start_with("").await
    }

    /// Like [`RabbitServer::start`], with extra `rabbitmq.conf` lines.
    pub async fn start_with(conf: &str) -> Self {
        let mut me = Self::prepare(conf);
        me.spawn().await;
        me
    }

    /// Like [`RabbitServer::start`], plus a TLS listener ([`RabbitServer::tls_url`]) presenting
    /// `pki`'s loopback server certificate and demanding a client certificate signed by its CA.
    /// The plain listener stays, for the test's own clients.
    pub async fn start_tls(pki: &Pki) -> Self {
        let tls_port = free_port();
        let (cert, key) = pki.server(ServerCert::Loopback);
        let conf = format!(
            "listeners.ssl.default = 127.0.0.1:{tls_port}\n\
             ssl_options.cacertfile = {}\n\
             ssl_options.certfile = {}\n\
             ssl_options.keyfile = {}\n\
             ssl_options.verify = verify_peer\n\
             ssl_options.fail_if_no_peer_cert = true\n",
            path_arg(&pki.ca()),
            path_arg(&cert),
            path_arg(&key),
        );
        let mut me = Self::prepare(&conf);
        me.tls_port = Some(tls_port);
        me.spawn().await;
        me
    }

    /// Like [`RabbitServer::start`], with the Erlang `cookie` that lets nodes of one cluster
    /// (and `rabbitmqctl`) talk to each other.
    pub async fn start_with_cookie(cookie: &str) -> Self {
        let mut me = Self::prepare("");
        me.clustered = true;
        let path = me.dir.path().join(".erlang.cookie");
        std::fs::write(&path, cookie).unwrap();
        // Erlang refuses a cookie file that others may read.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).unwrap();
        me.spawn().await;
        me
    }

    /// Its name, ports and files, not started yet.
    fn prepare(conf: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        std::fs::write(
            dir.path().join("rabbitmq.conf"),
            format!("listeners.tcp.local = 127.0.0.1:{port}\n{conf}\n"),
        )
        .unwrap();
        std::fs::write(dir.path().join("enabled_plugins"), "[].\n").unwrap();
        std::fs::write(dir.path().join("rabbitmq-env.conf"), "").unwrap();
        Self {
            port,
            tls_port: None,
            dist_port: free_port(),
            node: format!("{}@localhost", unique("delaybridge-test")),
            dir,
            running: false,
            clustered: false,
        }
    }

    fn command(&self, name: &str) -> Command {
        let d = self.dir.path();
        let mut cmd = Command::new(rabbit_bin(name));
        // HOME holds the Erlang cookie shared by the node and rabbitmqctl.
        cmd.env("HOME", d)
            .env("RABBITMQ_CONF_ENV_FILE", d.join("rabbitmq-env.conf"))
            .env("RABBITMQ_NODENAME", &self.node)
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("RABBITMQ_CONFIG_FILE", d.join("rabbitmq.conf"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", d.join("enabled_plugins"))
            .env("RABBITMQ_MNESIA_BASE", d.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", d.join("log"))
            .env("RABBITMQ_PID_FILE", d.join("rabbit.pid"))
            .env("ERL_EPMD_ADDRESS", "127.0.0.1")
            .current_dir(d)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        cmd
    }

    /// `rabbitmqctl -n NODE ARGS...`, run off the async threads.
    async fn rabbitmqctl(&self, args: &[&str]) -> std::process::ExitStatus {
        let mut ctl = self.command("rabbitmqctl");
        ctl.args(["-n", &self.node]).args(args);
        tokio::task::spawn_blocking(move || ctl.status())
            .await
            .unwrap()
            .expect("rabbitmqctl")
    }

    async fn spawn(&mut self) {
        let status = self
            .command("rabbitmq-server")
            .arg("-detached")
            .status()
            .expect("rabbitmq-server must be installed (see README)");
        assert!(status.success(), "rabbitmq-server -detached: {status}");
        self.running = true;
        assert!(
            wait_port(self.port, true, Duration::from_secs(90)).await,
            "private RabbitMQ did not open its port:\n{}",
            self.log()
        );
        // The port opens before the node is done booting; a connection made in between can be
        // aborted. Ready is when a client gets through the handshake.
        let url = self.url();
        let (ready, last) = poll(
            Duration::from_secs(60),
            Duration::from_millis(100),
            async || {
                let conn = lapin::Connection::connect(&url, Default::default()).await?;
                let _ = conn.close(200, "ready").await;
                Ok::<(), lapin::Error>(())
            },
            Result::is_ok,
        )
        .await;
        assert!(
            ready,
            "private RabbitMQ opened its port but refuses clients: {last:?}\n{}",
            self.log()
        );
        if let Some(tls_port) = self.tls_port {
            // Listeners open one after the other: the TLS one follows within moments.
            assert!(
                wait_port(tls_port, true, Duration::from_secs(30)).await,
                "private RabbitMQ did not open its TLS port:\n{}",
                self.log()
            );
        }
    }

    /// `amqp://guest:guest@127.0.0.1:PORT/%2f`
    pub fn url(&self) -> String {
        super::loopback_amqp(self.port)
    }

    /// Its address, for a proxy in front of it.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The TLS port of a node started with [`RabbitServer::start_tls`].
    pub fn tls_port(&self) -> u16 {
        self.tls_port.expect("started with RabbitServer::start_tls")
    }

    /// `amqps://guest:guest@127.0.0.1:TLS_PORT/%2f`
    pub fn tls_url(&self) -> String {
        format!("amqps://guest:guest@127.0.0.1:{}/%2f", self.tls_port())
    }

    /// `rabbitmqctl stop` (graceful: durable queues and persistent messages are kept), waiting
    /// for the node to exit.
    pub async fn stop(&mut self) {
        let pid_file = self.dir.path().join("rabbit.pid");
        let status = self
            .rabbitmqctl(&["stop", pid_file.to_str().unwrap()])
            .await;
        assert!(
            status.success(),
            "rabbitmqctl stop: {status}\n{}",
            self.log()
        );
        self.running = false;
        assert!(wait_port(self.port, false, Duration::from_secs(30)).await);
    }

    /// Runs `rabbitmqctl -n NODE ARGS...` and asserts it succeeded.
    pub async fn ctl(&self, args: &[&str]) {
        let status = self.rabbitmqctl(args).await;
        assert!(status.success(), "rabbitmqctl {args:?}: {status}");
    }

    /// Runs `rabbitmqctl -n NODE ARGS...`: its stdout if it succeeded, else stdout and stderr.
    pub async fn ctl_output(&self, args: &[&str]) -> Result<String, String> {
        let mut ctl = self.command("rabbitmqctl");
        ctl.args(["-n", &self.node]).args(args);
        let out = tokio::task::spawn_blocking(move || {
            ctl.stdout(Stdio::piped()).stderr(Stdio::piped()).output()
        })
        .await
        .unwrap()
        .expect("rabbitmqctl");
        super::stdout_if_success(&out)
    }

    /// The Erlang node name (`NAME@localhost`).
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The OS pid of the node (its pid file), while it runs.
    fn pid(&self) -> Option<i32> {
        let pid = std::fs::read_to_string(self.dir.path().join("rabbit.pid")).ok()?;
        pid.trim().parse::<i32>().ok().filter(|&pid| pid > 1)
    }

    /// SIGKILL of the node's own pid (never a name pattern): no goodbye to clients or peers,
    /// like a crashed machine's broker. Waits until its port is closed.
    pub async fn kill(&mut self) {
        let pid = self.pid().expect("the node wrote its pid file");
        kill(pid, 9);
        self.running = false;
        assert!(
            wait_port(self.port, false, Duration::from_secs(30)).await,
            "node {} (pid {pid}) still listens after SIGKILL",
            self.node
        );
    }

    /// Starts the node again with the same data.
    pub async fn restart(&mut self) {
        assert!(!self.running, "stop it first");
        self.spawn().await;
    }

    /// The node's log.
    pub fn log(&self) -> String {
        let path = self
            .dir
            .path()
            .join("log")
            .join(format!("{}.log", self.node));
        std::fs::read_to_string(path).unwrap_or_default()
    }
}

impl Drop for RabbitServer {
    fn drop(&mut self) {
        if !self.running {
            return;
        }
        if self.clustered {
            // A cluster node: its data dies with the test, so no graceful stop (which would
            // wait on its peers); its own pid, never a name pattern.
            if let Some(pid) = self.pid() {
                kill(pid, 9);
            }
            return;
        }
        let stopped = self
            .command("rabbitmqctl")
            .args(["-n", &self.node, "stop"])
            .arg(self.dir.path().join("rabbit.pid"))
            .status()
            .is_ok_and(|s| s.success());
        if !stopped {
            // Last resort: the node's own pid, never a name pattern.
            if let Some(pid) = self.pid() {
                kill(pid, 9);
            }
        }
    }
}

/// A path as a command-line or config value (the temp dirs' paths are UTF-8).
fn path_arg(path: &Path) -> String {
    path.to_str().expect("a UTF-8 temp path").to_string()
}
