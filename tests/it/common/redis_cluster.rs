//! A private Redis Cluster on free loopback ports: three masters with a replica each, formed
//! with `redis-cli --cluster create`, for tests that fail masters over and kill them.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use redis::AsyncCommands;

use super::{assert_success, poll};

/// One `redis-server` of the cluster.
struct Node {
    port: u16,
    child: Option<Child>,
}

/// Three masters and three replicas, each a child process killed on drop.
pub struct RedisCluster {
    nodes: Vec<Node>,
    dir: tempfile::TempDir,
    options: Options,
}

/// How the nodes are protected.
#[derive(Default)]
pub struct Options {
    /// `requirepass` (and `masterauth`) of every node.
    pub password: Option<String>,
    /// TLS only, for clients, replication and the cluster bus: the CA and a certificate for
    /// 127.0.0.1 from this PKI's directory (the CA file for the test's own clients).
    pub tls: Option<Tls>,
    /// The server program, if not `redis-server` (Valkey's `valkey-server`).
    pub binary: Option<std::path::PathBuf>,
}

/// The files of a TLS cluster: the CA, each node's server certificate and key, and the
/// client certificate and key nodes present to each other on the bus and in replication.
#[derive(Clone)]
pub struct Tls {
    pub ca: std::path::PathBuf,
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
    pub client_cert: std::path::PathBuf,
    pub client_key: std::path::PathBuf,
}

/// A loopback port that is free, and whose cluster bus port (+10000) is free too; both below
/// the kernel's ephemeral range, so that no outgoing connection holds them (and a client
/// connecting to a node not yet listening cannot connect to itself).
fn free_cluster_port() -> u16 {
    use rand::Rng;
    let mut rng = rand::thread_rng();
    loop {
        let port = rng.gen_range(10_000..20_000);
        let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && free(port + 10_000) {
            return port;
        }
    }
}

impl RedisCluster {
    /// Starts six nodes, forms the cluster (one replica per master) and waits until every
    /// node says `cluster_state:ok` and every replica's link to its master is up.
    pub async fn start() -> Self {
        Self::start_with(Options::default()).await
    }

    /// [`RedisCluster::start`] with a password or TLS.
    pub async fn start_with(options: Options) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut nodes = Vec::new();
        for _ in 0..6 {
            let port = free_cluster_port();
            let node_dir = dir.path().join(port.to_string());
            std::fs::create_dir_all(&node_dir).unwrap();
            let mut cmd =
                Command::new(options.binary.as_deref().unwrap_or("redis-server".as_ref()));
            cmd.args(["--bind", "127.0.0.1"]);
            match &options.tls {
                None => {
                    cmd.args(["--port", &port.to_string()]);
                }
                Some(tls) => {
                    cmd.args(["--port", "0", "--tls-port", &port.to_string()])
                        .args(["--tls-cluster", "yes", "--tls-replication", "yes"])
                        .arg("--tls-cert-file")
                        .arg(&tls.cert)
                        .arg("--tls-key-file")
                        .arg(&tls.key)
                        .arg("--tls-ca-cert-file")
                        .arg(&tls.ca)
                        .arg("--tls-client-cert-file")
                        .arg(&tls.client_cert)
                        .arg("--tls-client-key-file")
                        .arg(&tls.client_key)
                        .args(["--tls-auth-clients", "no"]);
                }
            }
            if let Some(password) = &options.password {
                cmd.args(["--requirepass", password, "--masterauth", password]);
            }
            let child = cmd
                .args(["--cluster-enabled", "yes"])
                .arg("--cluster-config-file")
                .arg(node_dir.join("nodes.conf"))
                .args(["--cluster-node-timeout", "2000"])
                .args(["--save", "", "--appendonly", "no"])
                .args(["--enable-debug-command", "local"])
                .args(["--repl-diskless-sync-delay", "0"])
                .arg("--dir")
                .arg(&node_dir)
                .arg("--logfile")
                .arg(node_dir.join("redis.log"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server must be installed (see README)");
            nodes.push(Node {
                port,
                child: Some(child),
            });
        }
        let me = Self {
            nodes,
            dir,
            options,
        };
        for node in &me.nodes {
            assert!(
                super::servers::wait_port(node.port, true, Duration::from_secs(20)).await,
                "cluster node {} did not start: {}",
                node.port,
                me.log(node.port)
            );
        }
        let addrs: Vec<String> = me
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let mut create = me.redis_cli();
        create.arg("--cluster").arg("create").args(&addrs).args([
            "--cluster-replicas",
            "1",
            "--cluster-yes",
        ]);
        let out = tokio::task::spawn_blocking(move || create.stdin(Stdio::null()).output())
            .await
            .unwrap()
            .expect("redis-cli must be installed");
        assert_success(&out, "redis-cli --cluster create failed: ");
        // 60 s: on two cores under a full test run, replicas' first syncs and the gossip that
        // makes every node agree on the slot map can take a good part of half a minute.
        if let Err(why) = me.wait_formed(Duration::from_secs(60)).await {
            let logs: Vec<String> = me
                .nodes
                .iter()
                .map(|n| {
                    let tail = super::tail(&me.log(n.port), 12);
                    format!("--- node {} (last 12 lines)\n{tail}", n.port)
                })
                .collect();
            panic!("the cluster did not form: {why}\n{}", logs.join("\n"));
        }
        me
    }

    /// Waits until every running node says `cluster_state:ok`, every replica's link is up,
    /// there are three masters that each have a replica, and every node sees the same master
    /// for every slot; on timeout, says what was still missing.
    pub async fn wait_formed(&self, timeout: Duration) -> Result<(), String> {
        poll(
            timeout,
            Duration::from_millis(100),
            async || {
                let mut masters = 0;
                // Every node's view of which master serves which slots, to see them agree:
                // a client that reads its slot map from a node still catching up follows
                // MOVED replies back and forth.
                let mut views = std::collections::BTreeSet::new();
                for node in self.nodes.iter().filter(|n| n.child.is_some()) {
                    let port = node.port;
                    let nodes = self
                        .cli(port, &["CLUSTER", "NODES"])
                        .await
                        .map_err(|e| format!("node {port}: CLUSTER NODES: {e}"))?;
                    views.insert(slot_owners(&nodes));
                    let info = self
                        .cli(port, &["CLUSTER", "INFO"])
                        .await
                        .map_err(|e| format!("node {port}: CLUSTER INFO: {e}"))?;
                    if !info.contains("cluster_state:ok") {
                        return Err(format!("node {port}: not cluster_state:ok"));
                    }
                    let repl = self
                        .cli(port, &["INFO", "replication"])
                        .await
                        .map_err(|e| format!("node {port}: INFO replication: {e}"))?;
                    if repl.contains("role:slave") && !repl.contains("master_link_status:up") {
                        return Err(format!("node {port}: replica whose link is not up"));
                    }
                    if repl.contains("role:master") && repl.contains("connected_slaves:1") {
                        masters += 1;
                    }
                }
                if masters != 3 {
                    return Err(format!("{masters} masters with a replica, not 3"));
                }
                if views.len() != 1 {
                    return Err(format!("{} different slot maps", views.len()));
                }
                Ok(())
            },
            |formed| formed.is_ok(),
        )
        .await
        .1
    }

    /// `redis-cli` with the password and TLS flags the nodes need.
    fn redis_cli(&self) -> Command {
        let mut cmd = Command::new("redis-cli");
        if let Some(password) = &self.options.password {
            cmd.env("REDISCLI_AUTH", password);
        }
        if let Some(tls) = &self.options.tls {
            cmd.arg("--tls").arg("--cacert").arg(&tls.ca);
        }
        cmd
    }

    /// The seed nodes for `[redis] nodes`: every node's `redis://` (or `rediss://`) URL.
    pub fn seeds(&self) -> Vec<String> {
        let scheme = if self.options.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        self.nodes
            .iter()
            .map(|n| format!("{scheme}://127.0.0.1:{}", n.port))
            .collect()
    }

    /// A client of the node on `port` with the password and CA.
    fn node_client(&self, port: u16) -> redis::RedisResult<redis::Client> {
        let scheme = if self.options.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        let auth = match &self.options.password {
            Some(p) => format!(":{p}@"),
            None => String::new(),
        };
        let url = format!("{scheme}://{auth}127.0.0.1:{port}");
        match &self.options.tls {
            None => redis::Client::open(url),
            Some(tls) => redis::Client::build_with_tls(
                url,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(std::fs::read(&tls.ca).unwrap()),
                },
            ),
        }
    }

    /// A cluster connection for the test's own commands (a producer's).
    pub async fn conn(&self) -> redis::cluster_async::ClusterConnection {
        let mut builder = redis::cluster::ClusterClient::builder(self.seeds())
            .retries(20)
            .connection_timeout(Duration::from_secs(10))
            .response_timeout(Duration::from_secs(30));
        if let Some(password) = &self.options.password {
            builder = builder.password(password.clone());
        }
        if let Some(tls) = &self.options.tls {
            builder = builder.certs(redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(std::fs::read(&tls.ca).unwrap()),
            });
        }
        builder
            .build()
            .unwrap()
            .get_async_connection()
            .await
            .expect("the private cluster answers")
    }

    /// Runs `redis-cli -p PORT ARGS...`: its stdout if it exited 0.
    pub async fn cli(&self, port: u16, args: &[&str]) -> Result<String, String> {
        let mut cmd = self.redis_cli();
        cmd.args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(args);
        let out = tokio::task::spawn_blocking(move || cmd.stdin(Stdio::null()).output())
            .await
            .unwrap()
            .map_err(|e| e.to_string())?;
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        if out.status.success() && !stdout.starts_with("ERR") {
            Ok(stdout)
        } else {
            Err(format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)))
        }
    }

    /// Starts `redis-cli -p PORT ARGS...` (one that blocks, like `DEBUG SLEEP`) and returns
    /// its end, to await later.
    pub fn cli_detached(&self, port: u16, args: &[&str]) -> tokio::task::JoinHandle<()> {
        let mut cmd = self.redis_cli();
        cmd.args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(args);
        tokio::task::spawn_blocking(move || {
            let _ = cmd.stdin(Stdio::null()).output();
        })
    }

    /// Waits (up to 5 s) until the node on `port` no longer answers a `PING` within 200 ms:
    /// a `DEBUG SLEEP` sent to it has begun. Plain TCP: not for a TLS cluster.
    pub async fn wait_unanswering(&self, port: u16) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let silent = async || {
            let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
                return true;
            };
            let mut buf = [0u8; 64];
            s.write_all(b"PING\r\n").await.is_err()
                || tokio::time::timeout(Duration::from_millis(200), s.read(&mut buf))
                    .await
                    .is_err()
        };
        let (hung, _) = poll(
            Duration::from_secs(5),
            Duration::from_millis(10),
            silent,
            |s| *s,
        )
        .await;
        assert!(hung, "node {port} still answers: {}", self.log(port));
    }

    /// `key`'s slot, as a node answers `CLUSTER KEYSLOT`.
    pub async fn keyslot(&self, key: &str) -> u16 {
        self.any_cli(&["CLUSTER", "KEYSLOT", key])
            .await
            .trim()
            .parse()
            .unwrap()
    }

    /// The port of the master that owns `key`'s slot now, asked of a running node.
    pub async fn master_of(&self, key: &str) -> u16 {
        let slot = self.keyslot(key).await;
        for node in self.nodes.iter().filter(|n| n.child.is_some()) {
            let Ok(client) = self.node_client(node.port) else {
                continue;
            };
            let Ok(mut c) = super::connect(&client).await else {
                continue;
            };
            let Ok(ranges) = redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query_async::<Vec<Vec<redis::Value>>>(&mut c)
                .await
            else {
                continue;
            };
            for range in ranges {
                let int = |v: &redis::Value| match v {
                    redis::Value::Int(i) => *i,
                    _ => -1,
                };
                let (start, end) = (int(&range[0]), int(&range[1]));
                if (start..=end).contains(&i64::from(slot)) {
                    if let redis::Value::Array(master) = &range[2] {
                        return int(&master[1]) as u16;
                    }
                }
            }
        }
        panic!("no master for slot {slot}")
    }

    /// The ports of the masters that serve slots now (a node's view of a replica may still
    /// say master for a moment after the cluster formed).
    pub async fn masters(&self) -> Vec<u16> {
        let nodes = self.any_cli(&["CLUSTER", "NODES"]).await;
        let mut out: Vec<u16> = nodes
            .lines()
            .filter_map(|l| {
                let fields: Vec<&str> = l.split_whitespace().collect();
                let flags = fields.get(2)?;
                if !flags.contains("master") || flags.contains("fail") || fields.len() < 9 {
                    return None;
                }
                fields.get(1)?.split(['@', ':']).nth(1)?.parse().ok()
            })
            .collect();
        out.sort_unstable();
        out
    }

    /// The port of `master`'s replica, as the master itself reports it (`INFO replication`:
    /// another node's `CLUSTER NODES` may not list the replica yet, gossip being behind).
    pub async fn replica_of(&self, master: u16) -> u16 {
        let (port, info) = poll(
            Duration::from_secs(10),
            Duration::from_millis(100),
            async || {
                let info = self
                    .cli(master, &["INFO", "replication"])
                    .await
                    .unwrap_or_default();
                let port = info
                    .lines()
                    .find(|l| l.starts_with("slave0:"))
                    .and_then(|l| l.split(',').find_map(|f| f.strip_prefix("port=")))
                    .and_then(|p| p.trim().parse::<u16>().ok());
                (port, info)
            },
            |(port, _)| port.is_some(),
        )
        .await
        .1;
        port.unwrap_or_else(|| panic!("the master has a replica: {info}"))
    }

    /// `redis-cli` against the first running node that answers.
    async fn any_cli(&self, args: &[&str]) -> String {
        for node in self.nodes.iter().filter(|n| n.child.is_some()) {
            if let Ok(out) = self.cli(node.port, args).await {
                return out;
            }
        }
        panic!("no cluster node answers {args:?}")
    }

    /// A hash tag per master: `tags[i]` lands on the i-th master of [`RedisCluster::masters`].
    pub async fn tag_per_master(&self, prefix: &str) -> Vec<String> {
        let masters = self.masters().await;
        let mut tags: Vec<Option<String>> = vec![None; masters.len()];
        for i in 0.. {
            let tag = format!("{prefix}{i}");
            let owner = self.master_of(&format!("{{{tag}}}")).await;
            let at = masters.iter().position(|m| *m == owner).unwrap();
            if tags[at].is_none() {
                tags[at] = Some(tag);
            }
            if tags.iter().all(Option::is_some) {
                break;
            }
        }
        tags.into_iter().flatten().collect()
    }

    /// `CLUSTER FAILOVER` on `replica`, then waits until it is a master.
    /// Has `replica` take over from its master (`CLUSTER FAILOVER`), calls `held` once the
    /// failover has begun, and waits until `replica` is a master.
    pub async fn failover(&self, replica: u16, held: &(dyn Fn() + Sync)) {
        self.cli(replica, &["CLUSTER", "FAILOVER"]).await.unwrap();
        held();
        let promoted = poll(
            Duration::from_secs(20),
            Duration::from_millis(50),
            async || self.cli(replica, &["ROLE"]).await.unwrap_or_default(),
            |role| role.starts_with("master"),
        )
        .await
        .0;
        assert!(promoted, "replica {replica} was not promoted");
    }

    /// SIGKILLs the node on `port`.
    pub fn kill(&mut self, port: u16) {
        let node = self.nodes.iter_mut().find(|n| n.port == port).unwrap();
        if let Some(mut child) = node.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits until `replica` has taken over from a failed master and the cluster is ok.
    pub async fn wait_promoted(&self, replica: u16, timeout: Duration) -> bool {
        poll(
            timeout,
            Duration::from_millis(100),
            async || {
                let role = self.cli(replica, &["ROLE"]).await.unwrap_or_default();
                let info = self
                    .cli(replica, &["CLUSTER", "INFO"])
                    .await
                    .unwrap_or_default();
                role.starts_with("master") && info.contains("cluster_state:ok")
            },
            |ok| *ok,
        )
        .await
        .0
    }

    /// `key`'s master's log, for failure messages.
    pub fn log(&self, port: u16) -> String {
        std::fs::read_to_string(self.dir.path().join(port.to_string()).join("redis.log"))
            .unwrap_or_default()
    }

    /// Schedules `members` at `due_ms` on `key` through the cluster.
    pub async fn zadd_all(
        conn: &mut redis::cluster_async::ClusterConnection,
        key: &str,
        due_ms: i64,
        members: &[String],
    ) {
        for chunk in members.chunks(1000) {
            let items: Vec<(i64, &String)> = chunk.iter().map(|m| (due_ms, m)).collect();
            let _: i64 = conn.zadd_multiple(key, &items).await.unwrap();
        }
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// The masters and their slots in a `CLUSTER NODES` reply, as one sorted line per master
/// (address and slot ranges), failed ones left out.
fn slot_owners(nodes: &str) -> Vec<String> {
    let mut owners: Vec<String> = nodes
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let flags = fields.get(2)?;
            let serving = flags.contains("master") && !flags.contains("fail");
            (serving && fields.len() > 8).then(|| {
                let addr = fields[1].split('@').next().unwrap_or(fields[1]);
                format!("{addr} {}", fields[8..].join(" "))
            })
        })
        .collect();
    owners.sort();
    owners
}
