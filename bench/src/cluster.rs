//! The Redis Cluster phase: claim and settle ceilings on one shard and on all, and forwarding.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use delay_bridge::keys::{shard_key, QueueKeys};
use delay_bridge::parts::config::{Redis, RedisConfig, RedisMode};
use delay_bridge::parts::redis::conn::{slot, Conn, Endpoint};
use futures_util::future::try_join_all;
use tokio::time::Instant;

use super::process::{free_port, BridgeProcess};
use super::redis_ops;
use super::report::{ClusterRun, Rate};
use super::{Bench, BridgeToml};

/// How long the cluster bridge may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
const STOP_TIMEOUT: Duration = Duration::from_secs(20);

impl Bench {
    /// Measures on the cluster at `--redis-cluster`, with `--messages` each time.
    pub(super) async fn cluster(&self) -> anyhow::Result<ClusterRun> {
        let n = self.args.messages;
        let config = RedisConfig {
            mode: RedisMode::Cluster,
            nodes: self.args.redis_cluster.clone(),
            ..RedisConfig::default()
        };
        let endpoint = Arc::new(Endpoint::new(&Redis::validate(config)?)?);
        let conn = endpoint
            .connect()
            .await
            .with_context(|| format!("connecting to {endpoint}"))?;
        let topology = conn
            .topology()
            .await
            .context("not a cluster")?
            .context("reading the cluster's slots")?;
        let masters = topology.masters();
        anyhow::ensure!(!masters.is_empty(), "the cluster has no master");
        // One trigger of `--shards` shards; each shard's slot, and so its master, is fixed by
        // its name.
        let shards = self.args.shards.max(1);
        let key = format!("delay-bridge-bench:{{{}-cl}}", self.run_id);
        let keys: Vec<String> = (0..shards)
            .map(|i| shard_key(&key, i, shards).expect("the key has a hash tag"))
            .collect();
        let mut spread: Vec<usize> = masters
            .iter()
            .map(|m| {
                keys.iter()
                    .filter(|k| topology.master_of(slot(k.as_bytes())) == Some(*m))
                    .count()
            })
            .collect();
        spread.sort_unstable();

        eprintln!("bench: cluster ceiling, 1 shard, {n} messages");
        let one_shard = self.cluster_ceiling(&conn, &keys[..1], n).await?;
        eprintln!(
            "bench: cluster ceiling, {shards} shards on {} masters ({spread:?} per master), {n} messages",
            masters.len()
        );
        let all_shards = self.cluster_ceiling(&conn, &keys, n).await?;
        eprintln!("bench: cluster forwarding, {shards} shards, {n} messages");
        let forward = self.cluster_forward(&conn, &key, &keys, n).await;
        for key in &keys {
            let _ = redis_ops::unlink_queue(&mut conn.clone(), key).await;
            let _ = redis_ops::unlink_queue(&mut conn.clone(), &staging(key)).await;
        }
        Ok(ClusterRun {
            masters: masters.len(),
            shards,
            spread,
            one_shard,
            all_shards,
            forward: forward?,
        })
    }

    /// `n` members spread over `keys`, drained by the bridge's claim and settle scripts with
    /// the bench trigger's workers spread over the keys, at least one per key, at once.
    async fn cluster_ceiling(&self, conn: &Conn, keys: &[String], n: u64) -> anyhow::Result<Rate> {
        let shape = self.args.shape();
        let due = now_ms() - 1000;
        let base = self.next_base();
        for (i, (lo, count)) in split(n, keys.len()).into_iter().enumerate() {
            let key = &keys[i];
            redis_ops::load(
                &mut conn.clone(),
                &shape,
                key,
                key,
                base + lo,
                count,
                |_| due,
            )
            .await?;
        }
        let per_key = (self.trigger.workers() / keys.len()).max(1);
        let start = Instant::now();
        let claimed: u64 = try_join_all(keys.iter().map(|key| {
            redis_ops::claim_ceiling(conn.clone(), key, &shape, per_key, self.trigger.batch())
        }))
        .await?
        .into_iter()
        .sum();
        let secs = start.elapsed().as_secs_f64();
        for key in keys {
            redis_ops::unlink_queue(&mut conn.clone(), key).await?;
        }
        if claimed != n {
            bail!("claimed {claimed} of {n} members");
        }
        Ok(Rate::new(n, secs))
    }

    /// A cluster-mode bridge with one trigger on `key`, whose shards are `keys`, draining `n`
    /// members due now, loaded beside each shard and renamed into it once the bridge is ready.
    async fn cluster_forward(
        &self,
        conn: &Conn,
        key: &str,
        keys: &[String],
        n: u64,
    ) -> anyhow::Result<Rate> {
        let shape = self.args.shape();
        let due = now_ms() - 1000;
        let base = self.next_base();
        let parts = split(n, keys.len());
        // All but each shard's last member, loaded beside the shard; the last is added with a
        // ZADD once the rest is renamed in: its notification wakes the shard's idle worker (a
        // rename is a generic event, not one of the sorted-set events the bridge asks for).
        for (key, (lo, count)) in keys.iter().zip(&parts) {
            redis_ops::load(
                &mut conn.clone(),
                &shape,
                key,
                &staging(key),
                base + lo,
                count.saturating_sub(1),
                |_| due,
            )
            .await?;
        }
        let port = free_port()?;
        let (path, _) = BridgeToml {
            args: &self.args,
            broker: &self.broker,
            keys: &[key.to_string()],
            notifications: true,
            metrics_port: port,
            backlog: false,
            cluster: &self.args.redis_cluster,
            shards: keys.len() as u32,
        }
        .write(&self.dir, "cluster")?;
        let log = self.dir.join("cluster.log");
        let mut bridge = BridgeProcess::spawn(&self.bridge, &path, port, &log)?;
        bridge.wait_ready(READY_TIMEOUT).await?;
        self.tally.reset(base, n);
        let start = Instant::now();
        for (key, (lo, count)) in keys.iter().zip(&parts) {
            if *count == 0 {
                continue;
            }
            if *count > 1 {
                redis::cmd("RENAME")
                    .arg(staging(key))
                    .arg(key)
                    .query_async::<()>(&mut conn.clone())
                    .await?;
            }
            let mut last = redis::pipe();
            shape.schedule(
                &mut last,
                &QueueKeys::derive(key)?,
                key,
                base + lo + count - 1,
                due,
            );
            last.query_async::<()>(&mut conn.clone()).await?;
        }
        let end = start + Duration::from_secs(60) + Duration::from_millis(n);
        self.wait_drained(conn, keys, n, &bridge, end).await?;
        let secs = start.elapsed().as_secs_f64();
        bridge.stop(STOP_TIMEOUT).await?;
        Ok(Rate::new(n, secs))
    }
}

/// Where a queue's members wait until the timed part starts: in the queue's slot.
fn staging(key: &str) -> String {
    format!("{key}:staging")
}

/// `n` split into `parts` consecutive ranges: (offset, count) each.
fn split(n: u64, parts: usize) -> Vec<(u64, u64)> {
    let parts = parts.max(1) as u64;
    (0..parts)
        .map(|i| {
            let lo = n * i / parts;
            (lo, n * (i + 1) / parts - lo)
        })
        .collect()
}

fn now_ms() -> i64 {
    super::tally::now_us() / 1000
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn a_split_covers_every_message_once() {
        assert_eq!(split(10, 3), vec![(0, 3), (3, 3), (6, 4)]);
        assert_eq!(split(5, 1), vec![(0, 5)]);
        let total: u64 = split(200_000, 7).iter().map(|(_, c)| c).sum();
        assert_eq!(total, 200_000);
    }
}
