//! A private RabbitMQ cluster on loopback: nodes sharing one Erlang cookie, joined to the
//! first, each stopped, killed or restarted by itself; every node killed by its pid on drop.

use std::time::{Duration, Instant};

use super::poll;
use super::servers::RabbitServer;

/// How long forming a cluster or restarting a node may take: three nodes booting at once on
/// two cores take 15-20 s, more while other tests run.
pub const FORMING: Duration = Duration::from_secs(180);

/// Nodes of one cluster, in the order they were started (`nodes[0]` is the one the others
/// joined).
pub struct RabbitCluster {
    /// The nodes.
    pub nodes: Vec<RabbitServer>,
    /// How long starting and joining the nodes took.
    pub formed_in: Duration,
}

impl RabbitCluster {
    /// Starts `n` nodes at once, joins every other one to the first (`stop_app`,
    /// `join_cluster`, `start_app`) and waits until `cluster_status` lists them all running.
    pub async fn start(n: usize) -> Self {
        let started = Instant::now();
        let cookie = format!("DELAYBRIDGE{:016X}", rand::random::<u64>());
        let nodes = futures_util::future::join_all(
            (0..n).map(|_| RabbitServer::start_with_cookie(&cookie)),
        )
        .await;
        for node in &nodes[1..] {
            node.ctl(&["stop_app"]).await;
            node.ctl(&["join_cluster", nodes[0].node()]).await;
            node.ctl(&["start_app"]).await;
        }
        let mut me = Self {
            nodes,
            formed_in: Duration::ZERO,
        };
        let all: Vec<usize> = (0..n).collect();
        me.expect_running(&all, FORMING).await;
        me.formed_in = started.elapsed();
        me
    }

    /// Every node's AMQP URL (guest), in node order.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RabbitServer::url).collect()
    }

    /// Asserts that within `timeout` `cluster_status`, asked of the first of `running`, lists
    /// exactly the nodes `running` as running.
    pub async fn expect_running(&self, running: &[usize], timeout: Duration) {
        let via = &self.nodes[running[0]];
        let mut expected: Vec<&str> = running.iter().map(|&i| self.nodes[i].node()).collect();
        expected.sort_unstable();
        let (formed, last) = poll(
            timeout,
            Duration::from_millis(500),
            async || {
                let status = via
                    .ctl_output(&["cluster_status", "--formatter", "json"])
                    .await?;
                let json: serde_json::Value =
                    serde_json::from_str(&status).map_err(|e| format!("{e}: {status}"))?;
                let mut nodes: Vec<String> = json["running_nodes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|n| n.as_str().map(str::to_string))
                    .collect();
                nodes.sort_unstable();
                Ok::<_, String>(nodes)
            },
            |nodes| matches!(nodes, Ok(nodes) if *nodes == expected),
        )
        .await;
        assert!(
            formed,
            "cluster_status: {last:?}, expected {expected:?}\n{}",
            self.logs()
        );
    }

    /// Which node the connection named `name` (the bridge's is `delay-bridge/SINK`) is on,
    /// asked of node `via`: `Ok(None)` if there is no such connection.
    pub async fn node_of_connection(
        &self,
        name: &str,
        via: usize,
    ) -> Result<Option<usize>, String> {
        let out = self.nodes[via]
            .ctl_output(&[
                "list_connections",
                "port",
                "client_properties",
                "--formatter",
                "json",
            ])
            .await?;
        let connections: Vec<serde_json::Value> =
            serde_json::from_str(&out).map_err(|e| format!("{e}: {out}"))?;
        let port = connections.iter().find_map(|c| {
            let props = c["client_properties"].as_array()?;
            let named = props
                .iter()
                .any(|p| p[0] == "connection_name" && p[2] == name);
            named.then(|| c["port"].as_u64()).flatten()
        });
        Ok(port.and_then(|port| self.nodes.iter().position(|n| u64::from(n.port) == port)))
    }

    /// Polls [`RabbitCluster::node_of_connection`] until the connection is on one of
    /// `expected`, up to `timeout`; returns the last answer.
    pub async fn wait_connection_on(
        &self,
        name: &str,
        expected: &[usize],
        timeout: Duration,
    ) -> Result<Option<usize>, String> {
        let via = expected[0];
        poll(
            timeout,
            Duration::from_millis(200),
            async || self.node_of_connection(name, via).await,
            |on| matches!(on, Ok(Some(i)) if expected.contains(i)),
        )
        .await
        .1
    }

    /// Which node leads quorum queue `queue`, asked of node `via`.
    pub async fn leader_of(&self, queue: &str, via: usize) -> Option<usize> {
        let out = self.nodes[via]
            .ctl_output(&["list_queues", "name", "leader", "--formatter", "json"])
            .await
            .ok()?;
        let queues: Vec<serde_json::Value> = serde_json::from_str(&out).ok()?;
        let leader = queues
            .iter()
            .find(|q| q["name"] == queue)?
            .get("leader")?
            .as_str()?
            .to_string();
        self.nodes.iter().position(|n| n.node() == leader)
    }

    /// Every node's log, for a failed assertion.
    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| {
                format!(
                    "--- {} (last 30 lines)\n{}",
                    n.node(),
                    super::tail(&n.log(), 30)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}
