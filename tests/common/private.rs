//! Private Redis and RabbitMQ servers on free loopback ports, for tests that restart them.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Polls until a TCP connect to `port` succeeds (`up`) or fails (`!up`), up to `timeout`.
pub async fn wait_port(port: u16, up: bool, timeout: Duration) -> bool {
    let end = Instant::now() + timeout;
    loop {
        let open = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok();
        if open == up {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A `redis-server` child with `appendonly yes` in a temp dir; killed on drop.
pub struct PrivateRedis {
    /// Its port on 127.0.0.1.
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl PrivateRedis {
    /// Starts it and waits until it answers.
    pub async fn start() -> Self {
        let mut me = Self {
            port: crate::common::free_port(),
            dir: tempfile::tempdir().unwrap(),
            child: None,
        };
        me.spawn().await;
        me
    }

    async fn spawn(&mut self) {
        let dir = self.dir.path();
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args([
                "--appendonly",
                "yes",
                "--appendfsync",
                "everysec",
                "--save",
                "",
            ])
            .arg("--dir")
            .arg(dir)
            .arg("--logfile")
            .arg(dir.join("redis.log"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (see README)");
        self.child = Some(child);
        // Any data command fails with LOADING until the AOF is replayed.
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(mut c) = self.try_conn().await {
                let r: redis::RedisResult<i64> = redis::cmd("DBSIZE").query_async(&mut c).await;
                if r.is_ok() {
                    return;
                }
            }
            assert!(
                Instant::now() < end,
                "private redis-server did not start: {}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn try_conn(&self) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        redis::Client::open(self.url())?
            .get_multiplexed_async_connection()
            .await
    }

    /// `redis://127.0.0.1:PORT/0`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Its address, for a proxy in front of it.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// A connection straight to it (not through any proxy).
    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        self.try_conn().await.expect("private redis answers")
    }

    /// `SHUTDOWN` (the AOF is flushed first) and waits for the process to exit.
    pub async fn shutdown(&mut self) {
        if let Ok(mut c) = self.try_conn().await {
            // The server closes the connection instead of replying.
            let _: redis::RedisResult<()> = redis::cmd("SHUTDOWN").query_async(&mut c).await;
        }
        let mut child = self.child.take().expect("running");
        let end = Instant::now() + Duration::from_secs(10);
        while child.try_wait().unwrap().is_none() {
            if Instant::now() >= end {
                let _ = child.kill();
                let _ = child.wait();
                panic!("redis-server ignored SHUTDOWN: {}", self.log());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts it again on the same port and data directory.
    pub async fn restart(&mut self) {
        assert!(self.child.is_none(), "shut it down first");
        self.spawn().await;
    }

    /// The server's log file.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A RabbitMQ node of its own (name, ports, data and logs in a temp dir, no plugins), so it
/// can be stopped and started without touching the shared broker. Stopped on drop.
pub struct PrivateRabbit {
    /// AMQP port on 127.0.0.1.
    pub port: u16,
    dist_port: u16,
    node: String,
    dir: tempfile::TempDir,
    running: bool,
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

impl PrivateRabbit {
    /// Starts a detached node and waits for its AMQP listener (a few seconds).
    pub async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = crate::common::free_port();
        std::fs::write(
            dir.path().join("rabbitmq.conf"),
            format!("listeners.tcp.local = 127.0.0.1:{port}\n"),
        )
        .unwrap();
        std::fs::write(dir.path().join("enabled_plugins"), "[].\n").unwrap();
        std::fs::write(dir.path().join("rabbitmq-env.conf"), "").unwrap();
        let mut me = Self {
            port,
            dist_port: crate::common::free_port(),
            node: format!("{}@localhost", crate::common::unique("delaybridge-test")),
            dir,
            running: false,
        };
        me.spawn().await;
        me
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
    }

    /// `amqp://guest:guest@127.0.0.1:PORT/%2f`
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    /// Its address, for a proxy in front of it.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// `rabbitmqctl stop` (graceful: durable queues and persistent messages are kept), waiting
    /// for the node to exit.
    pub async fn stop(&mut self) {
        let mut ctl = self.command("rabbitmqctl");
        ctl.args(["-n", &self.node, "stop"])
            .arg(self.dir.path().join("rabbit.pid"));
        let status = tokio::task::spawn_blocking(move || ctl.status())
            .await
            .unwrap()
            .expect("rabbitmqctl");
        assert!(
            status.success(),
            "rabbitmqctl stop: {status}\n{}",
            self.log()
        );
        self.running = false;
        assert!(wait_port(self.port, false, Duration::from_secs(30)).await);
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

impl Drop for PrivateRabbit {
    fn drop(&mut self) {
        if !self.running {
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
            if let Ok(pid) = std::fs::read_to_string(self.dir.path().join("rabbit.pid")) {
                match pid.trim().parse::<i32>() {
                    Ok(pid) if pid > 1 => crate::common::unsafe_kill(pid, 9),
                    _ => {}
                }
            }
        }
    }
}
