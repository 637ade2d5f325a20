//! The addresses of an AMQP sink (one node, or a cluster's nodes) with the credentials
//! applied, and the order a connection attempt tries them in.

use std::sync::atomic::{AtomicUsize, Ordering};

use rand::Rng;

use crate::config::AmqpSinkConfig;
use crate::secret::redact_url;

/// One node's address.
pub(super) struct Node {
    /// What lapin connects to: the password file and the heartbeat applied.
    pub url: String,
    /// The configured address with its password redacted, for logs.
    pub shown: String,
}

/// A sink's nodes, and which one the last connection was on.
pub(super) struct Nodes {
    nodes: Vec<Node>,
    /// Index of the node of the last connection, `usize::MAX` before the first.
    last: AtomicUsize,
}

impl Nodes {
    /// Every address of the sink, with `password_file` (read now) applied to each.
    pub(super) fn new(name: &str, config: &AmqpSinkConfig) -> anyhow::Result<Self> {
        let password = match &config.password_file {
            Some(file) => Some(crate::secret::read_file(file)?),
            None => None,
        };
        let mut nodes = Vec::new();
        for raw in config.addresses() {
            let mut url = url::Url::parse(raw)?;
            if let Some(password) = &password {
                url.set_password(Some(password))
                    .map_err(|_| anyhow::anyhow!("sinks.{name}: {raw} cannot carry a password"))?;
            }
            nodes.push(Node {
                url: with_heartbeat(url).to_string(),
                shown: redact_url(raw),
            });
        }
        anyhow::ensure!(!nodes.is_empty(), "sinks.{name}: no address");
        Ok(Self {
            nodes,
            last: AtomicUsize::new(usize::MAX),
        })
    }

    /// The nodes in the order the next connection attempt tries them: from a random one, so
    /// that several bridges spread over a cluster, with the node of the last connection (it
    /// dropped, or was given up on) last.
    pub(super) fn round(&self) -> impl Iterator<Item = (usize, &Node)> {
        let start = rand::thread_rng().gen_range(0..self.nodes.len());
        let last = self.last.load(Ordering::Relaxed);
        order(self.nodes.len(), start, last)
            .into_iter()
            .map(|i| (i, &self.nodes[i]))
    }

    /// The connection is now on node `i`.
    pub(super) fn connected(&self, i: usize) {
        self.last.store(i, Ordering::Relaxed);
    }
}

/// `0..n` rotated to begin at `start`, with `last` (if it is a node) moved to the end.
fn order(n: usize, start: usize, last: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).map(|k| (start + k) % n).collect();
    if let Some(pos) = order.iter().position(|&i| i == last) {
        let node = order.remove(pos);
        order.push(node);
    }
    order
}

/// Adds a 10 s heartbeat unless the URL sets one, so a silently dead connection is noticed
/// in seconds rather than the broker's default minute.
fn with_heartbeat(mut url: url::Url) -> url::Url {
    if !url.query_pairs().any(|(k, _)| k == "heartbeat") {
        url.query_pairs_mut().append_pair("heartbeat", "10");
    }
    url
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_heartbeat_is_added_unless_set() {
        let u = with_heartbeat(url::Url::parse("amqp://g:p@h:5672/%2f").unwrap());
        assert_eq!(u.as_str(), "amqp://g:p@h:5672/%2f?heartbeat=10");
        let u = with_heartbeat(url::Url::parse("amqp://h/%2f?heartbeat=3").unwrap());
        assert_eq!(u.as_str(), "amqp://h/%2f?heartbeat=3");
    }

    #[test]
    fn a_round_tries_every_node_once_and_the_last_one_last() {
        assert_eq!(order(1, 0, usize::MAX), [0]);
        assert_eq!(order(1, 0, 0), [0]);
        assert_eq!(order(3, 0, usize::MAX), [0, 1, 2]);
        assert_eq!(order(3, 2, usize::MAX), [2, 0, 1]);
        // The connection on node 1 dropped: the others first, whatever the random start.
        assert_eq!(order(3, 0, 1), [0, 2, 1]);
        assert_eq!(order(3, 1, 1), [2, 0, 1]);
        assert_eq!(order(3, 2, 1), [2, 0, 1]);
    }

    fn config(urls: &[&str], password_file: Option<String>) -> AmqpSinkConfig {
        AmqpSinkConfig {
            url: None,
            urls: Some(urls.iter().map(|u| u.to_string()).collect()),
            password_file,
            declare: Vec::new(),
            reconnect_max: std::time::Duration::from_secs(1),
            channels: 4,
            max_unconfirmed: 256,
            tls: None,
        }
    }

    #[test]
    fn the_password_file_applies_to_every_node_and_logs_never_show_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "s3cret\n").unwrap();
        let c = config(
            &["amqp://app@n1:5672/%2f", "amqps://app:old@n2:5671/%2f"],
            Some(file.display().to_string()),
        );
        let nodes = Nodes::new("r", &c).unwrap();
        let urls: Vec<&str> = nodes.nodes.iter().map(|n| n.url.as_str()).collect();
        assert_eq!(
            urls,
            [
                "amqp://app:s3cret@n1:5672/%2f?heartbeat=10",
                "amqps://app:s3cret@n2:5671/%2f?heartbeat=10"
            ]
        );
        let shown: Vec<&str> = nodes.nodes.iter().map(|n| n.shown.as_str()).collect();
        assert_eq!(
            shown,
            ["amqp://app@n1:5672/%2f", "amqps://app:***@n2:5671/%2f"]
        );
    }

    #[test]
    fn the_first_round_starts_anywhere() {
        let nodes =
            Nodes::new("r", &config(&["amqp://a/", "amqp://b/", "amqp://c/"], None)).unwrap();
        let mut first = [0; 3];
        for _ in 0..300 {
            first[nodes.round().next().unwrap().0] += 1;
        }
        assert!(first.iter().all(|&n| n > 0), "{first:?}");
    }

    #[test]
    fn after_a_connection_its_node_goes_last() {
        let nodes =
            Nodes::new("r", &config(&["amqp://a/", "amqp://b/", "amqp://c/"], None)).unwrap();
        for _ in 0..20 {
            let mut round: Vec<usize> = nodes.round().map(|(i, _)| i).collect();
            round.sort_unstable();
            assert_eq!(round, [0, 1, 2], "every node once");
        }
        nodes.connected(1);
        for _ in 0..20 {
            assert_eq!(nodes.round().last().map(|(i, _)| i), Some(1));
        }
    }
}
