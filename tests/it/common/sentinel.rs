//! A private Redis Sentinel set on free loopback ports: a master, one replica and three sentinels (`redis-server --sentinel`) watching it, quick to fail over.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::servers::{wait_port, RedisServer};
use super::tls::{Pki, ServerCert};
use super::{free_port, poll};

/// The name the sentinels know the master by.
pub const MASTER_NAME: &str = "mymaster";

/// The master, its replica and three sentinels; every process killed on drop.
pub struct SentinelSet {
    /// The master at start.
    pub master: RedisServer,
    /// Its replica, the master after a failover (none in a TLS set).
    pub replica: Option<RedisServer>,
    /// The sentinels' ports.
    pub ports: Vec<u16>,
    /// A TLS set: the CA that signed every server's and sentinel's certificate.
    ca: Option<std::path::PathBuf>,
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
        Self::watched(master, Some(replica), None).await
    }

    /// A master alone, TLS only, watched by three sentinels that speak TLS only too, each
    /// with `pki`'s certificate for 127.0.0.1 (client certificates not asked for).
    pub async fn start_tls(pki: &Pki) -> Self {
        let master = RedisServer::start_tls(pki, ServerCert::Loopback, false).await;
        Self::watched(master, None, Some(pki)).await
    }

    async fn watched(master: RedisServer, replica: Option<RedisServer>, pki: Option<&Pki>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut me = Self {
            master,
            replica,
            ports: Vec::new(),
            ca: pki.map(Pki::ca),
            sentinels: Vec::new(),
            dir,
        };
        for i in 0..3 {
            me.start_sentinel(i, pki);
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

    fn start_sentinel(&mut self, i: usize, pki: Option<&Pki>) {
        let port = free_port();
        let dir = self.dir.path().join(format!("sentinel-{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        let conf = dir.join("sentinel.conf");
        let listen = match pki {
            None => format!("port {port}\n"),
            Some(pki) => {
                let (cert, key) = pki.server(ServerCert::Loopback);
                format!(
                    "port 0\ntls-port {port}\ntls-replication yes\ntls-auth-clients no\n\
                     tls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\n",
                    cert.display(),
                    key.display(),
                    pki.ca().display()
                )
            }
        };
        std::fs::write(
            &conf,
            format!(
                "{listen}bind 127.0.0.1\ndir {dir}\nlogfile {dir}/sentinel.log\n\
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

    /// `redis://127.0.0.1:PORT` (`rediss://` in a TLS set) of each sentinel, as a TOML array.
    pub fn toml_array(&self) -> String {
        let scheme = if self.ca.is_some() { "rediss" } else { "redis" };
        let urls: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("\"{scheme}://127.0.0.1:{p}\""))
            .collect();
        format!("[{}]", urls.join(", "))
    }

    /// What sentinel `port` says of the master: its fields.
    async fn master_fields(&self, port: u16) -> Option<std::collections::HashMap<String, String>> {
        let client = match &self.ca {
            None => redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?,
            Some(ca) => redis::Client::build_with_tls(
                format!("rediss://127.0.0.1:{port}"),
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(std::fs::read(ca).ok()?),
                },
            )
            .ok()?,
        };
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

    /// Waits until every sentinel sees the replica (if any) and the two other sentinels.
    async fn wait_formed(&self) {
        let replicas = if self.replica.is_some() { "1" } else { "0" };
        for &port in &self.ports {
            let (formed, _) = poll(
                Duration::from_secs(20),
                Duration::from_millis(100),
                async || self.master_fields(port).await,
                |fields| {
                    fields.as_ref().is_some_and(|f| {
                        f.get("num-slaves").map(String::as_str) == Some(replicas)
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
            if let Some(fields) = self.master_fields(port).await {
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
