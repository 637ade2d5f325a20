//! A private Redis Sentinel set on free loopback ports: a master, one replica and three sentinels (`redis-server --sentinel`) watching it, quick to fail over.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::servers::{wait_port, RedisServer};
use super::{free_port, poll};

/// The name the sentinels know the master by.
pub const MASTER_NAME: &str = "mymaster";

/// The master, its replica and three sentinels; every process killed on drop.
pub struct SentinelSet {
    /// The master at start.
    pub master: RedisServer,
    /// Its replica, the master after a failover.
    pub replica: RedisServer,
    /// The sentinels' ports.
    pub ports: Vec<u16>,
    sentinels: Vec<Child>,
    dir: tempfile::TempDir,
}

impl SentinelSet {
    /// Starts the master and its replica (both with `extra` arguments), then three sentinels
    /// (a master down for 1 s is failed over), and waits until the sentinels know the replica
    /// and each other.
    pub async fn start(extra: &[&str]) -> Self {
        let master = RedisServer::start(extra).await;
        let replicaof = format!("127.0.0.1 {}", master.port);
        let mut args = vec!["--replicaof", &replicaof];
        args.extend_from_slice(extra);
        let replica = RedisServer::start(&args).await;
        let dir = tempfile::tempdir().unwrap();
        let mut me = Self {
            master,
            replica,
            ports: Vec::new(),
            sentinels: Vec::new(),
            dir,
        };
        for i in 0..3 {
            me.start_sentinel(i);
        }
        for port in me.ports.clone() {
            assert!(
                wait_port(port, true, Duration::from_secs(10)).await,
                "sentinel on {port} did not start: {}",
                me.logs()
            );
        }
        me.wait_formed().await;
        me
    }

    fn start_sentinel(&mut self, i: usize) {
        let port = free_port();
        let dir = self.dir.path().join(format!("sentinel-{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\nlogfile {dir}/sentinel.log\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {master} 2\n\
                 sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
                 sentinel failover-timeout {MASTER_NAME} 5000\n\
                 sentinel parallel-syncs {MASTER_NAME} 1\n",
                dir = dir.display(),
                master = self.master.port,
            ),
        )
        .unwrap();
        let child = Command::new("redis-server")
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (see README)");
        self.ports.push(port);
        self.sentinels.push(child);
    }

    /// `redis://127.0.0.1:PORT` of each sentinel, as a TOML array.
    pub fn toml_array(&self) -> String {
        let urls: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("\"redis://127.0.0.1:{p}\""))
            .collect();
        format!("[{}]", urls.join(", "))
    }

    /// What sentinel `port` says of the master: its fields.
    async fn master_fields(port: u16) -> Option<std::collections::HashMap<String, String>> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
        let mut conn = super::connect(&client).await.ok()?;
        let flat: Vec<String> = redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(MASTER_NAME)
            .query_async(&mut conn)
            .await
            .ok()?;
        Some(
            flat.chunks(2)
                .filter_map(|kv| Some((kv.first()?.clone(), kv.get(1)?.clone())))
                .collect(),
        )
    }

    /// Waits until every sentinel sees the replica and the two other sentinels.
    async fn wait_formed(&self) {
        for &port in &self.ports {
            let (formed, _) = poll(
                Duration::from_secs(20),
                Duration::from_millis(100),
                async || Self::master_fields(port).await,
                |fields| {
                    fields.as_ref().is_some_and(|f| {
                        f.get("num-slaves").map(String::as_str) == Some("1")
                            && f.get("num-other-sentinels").map(String::as_str) == Some("2")
                    })
                },
            )
            .await;
            assert!(
                formed,
                "sentinel {port} did not see its peers: {}",
                self.logs()
            );
        }
    }

    /// The master's port as the first sentinel that answers names it.
    pub async fn master_port(&self) -> Option<u16> {
        for &port in &self.ports {
            if let Some(fields) = Self::master_fields(port).await {
                return fields.get("port")?.parse().ok();
            }
        }
        None
    }

    /// Every sentinel's log.
    pub fn logs(&self) -> String {
        (0..self.ports.len())
            .map(|i| {
                let path = self.dir.path().join(format!("sentinel-{i}/sentinel.log"));
                std::fs::read_to_string(path).unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join("\n---\n")
    }
}

impl Drop for SentinelSet {
    fn drop(&mut self) {
        for child in &mut self.sentinels {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
