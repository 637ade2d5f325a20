//! The ceilings the bridge is measured against: the broker's for Kafka (the sink's producer
//! alone) and HTTP (the client alone; RabbitMQ's are in [`rabbit`](super::rabbit)), and
//! Redis's (the claim and settle scripts alone).

use super::*;

impl Bench {
    pub(super) async fn broker_ceiling(&self) -> anyhow::Result<Rate> {
        if let crate::Broker::Http(endpoint) = &self.broker {
            return self.http_ceiling(endpoint).await;
        }
        let n = self.args.messages;
        eprintln!("bench: broker ceiling, {n} messages");
        let window = |base, count| Window {
            key: "delay-bridge-bench:ceiling".into(),
            base,
            count,
            payload_bytes: self.args.payload_bytes,
            due_ms: now_ms(),
            batch: self.trigger.batch(),
        };
        // One publisher per worker, connected before anything is timed.
        let ceiling = Ceiling::connect(
            &self.sink,
            &self.destination,
            self.trigger.workers(),
            self.trigger.publish_timeout(),
        )
        .await?;
        let timed = async {
            // A first round trip outside the timing: the consumer's first fetch and the
            // broker's first writes to a new queue or topic are not the broker's rate.
            let warm = n.min(1000);
            let base = self.next_base();
            self.tally.reset(base, warm);
            ceiling.publish(&window(base, warm)).await?;
            self.wait_received(warm, budget(warm)).await?;
            let base = self.next_base();
            self.tally.reset(base, n);
            let start = ceiling.publish(&window(base, n)).await?;
            self.wait_received(n, budget(n)).await?;
            Ok(Rate::new(n, start.elapsed().as_secs_f64()))
        }
        .await;
        ceiling.close().await;
        timed
    }

    /// The HTTP client alone calling the bench endpoint, as many requests at once as the
    /// bench sink allows: the endpoint's and the client's limit, without the bridge.
    async fn http_ceiling(&self, endpoint: &crate::http::HttpBench) -> anyhow::Result<Rate> {
        let n = self.args.messages;
        eprintln!("bench: http ceiling, {n} requests");
        let bytes = self.args.payload_bytes;
        let warm = n.min(1000);
        let base = self.next_base();
        self.tally.reset(base, warm);
        endpoint.ceiling(base, warm, bytes, now_ms()).await?;
        self.wait_received(warm, budget(warm)).await?;
        let base = self.next_base();
        self.tally.reset(base, n);
        let start = endpoint.ceiling(base, n, bytes, now_ms()).await?;
        self.wait_received(n, budget(n)).await?;
        Ok(Rate::new(n, start.elapsed().as_secs_f64()))
    }

    pub(super) async fn redis_ceiling(&self) -> anyhow::Result<Rate> {
        let n = self.args.messages;
        eprintln!("bench: redis ceiling, {n} messages");
        let key = self.new_key("claim");
        let mut conn = self.conn.clone();
        let due = now_ms() - 1000;
        let base = self.next_base();
        let shape = self.args.shape();
        redis_ops::load(&mut conn, &shape, &key, &key, base, n, |_| due).await?;
        let cm = delay_bridge::parts::redis::conn::Conn::open(&self.args.redis_url).await?;
        let start = Instant::now();
        let claimed = redis_ops::claim_ceiling(
            cm,
            &key,
            &shape,
            self.trigger.workers(),
            self.trigger.batch(),
        )
        .await?;
        let secs = start.elapsed().as_secs_f64();
        redis_ops::unlink_queue(&mut conn, &key).await?;
        if claimed != n {
            bail!("claimed {claimed} of {n} members");
        }
        Ok(Rate::new(n, secs))
    }
}
