//! A herd beside a trickle: many members due at one millisecond in one trigger while another
//! trigger of the same bridge, on the same sink, receives a few messages per second.

use super::*;
use crate::report::Herd;

/// Share of the time the trickle's messages are scheduled ahead of their write: 0 to this
/// many ms, so some are due at once (a notification's claim) and some later (the head timer).
const TRICKLE_AHEAD_MS: i64 = 500;

impl Bench {
    /// Releases `--herd` members due at one millisecond in one trigger and, until the consumer
    /// holds all of them, schedules `--herd-trickle` messages per second in a second trigger
    /// publishing to the same place through the same sink: the herd's drain rate, and the
    /// lateness of the trickle behind it.
    pub(super) async fn herd(&self) -> anyhow::Result<Herd> {
        let (n, per_s) = (self.args.herd, self.args.herd_trickle);
        eprintln!("bench: herd, {n} due at once beside {per_s} msg/s on another trigger");
        let staged = self.stage("herd", n).await?;
        let trickle = self.new_key("trickle");
        let keys = [staged.key.clone(), trickle.clone()];
        let (bridge, _) = self.start_bridge("herd", &keys, true).await?;
        let end = Instant::now() + budget(n);
        // The trickle's sequence numbers follow the herd's, in the same phase.
        let room = per_s * (budget(n).as_secs() + 1);
        self.tally.reset(staged.base, n + room);
        let cpu_before = bridge.cpu_seconds()?;
        let (mut conn, shape) = (self.conn.clone(), self.args.shape());
        let queue = QueueKeys::derive(&trickle)?;
        let mut rng = rand::rngs::StdRng::from_entropy();
        let start = Instant::now();
        self.release(&staged).await?;
        let mut sent = 0u64;
        let drained = loop {
            tokio::time::sleep(Duration::from_millis(5)).await;
            let herd_received = self.tally.distinct() - self.tally.distinct_in(n, n + sent);
            if herd_received >= n {
                break start.elapsed();
            }
            if Instant::now() >= end {
                bail!(
                    "the consumer received {herd_received} of the herd's {n}; {}",
                    bridge.log_tail()
                );
            }
            let target = ((per_s as f64 * start.elapsed().as_secs_f64()) as u64).min(room);
            if target > sent {
                let mut pipe = redis::pipe();
                for seq in sent..target {
                    let due = now_ms() + rng.gen_range(0..=TRICKLE_AHEAD_MS);
                    shape.schedule(&mut pipe, &queue, &trickle, staged.base + n + seq, due);
                }
                pipe.query_async::<()>(&mut conn).await?;
                sent = target;
            }
        };
        let cpu = bridge.cpu_seconds()? - cpu_before;
        let end = Instant::now() + Duration::from_secs(35);
        self.wait_drained(&conn, &keys, n + sent, &bridge, end)
            .await?;
        bridge.stop(STOP_TIMEOUT).await?;
        for key in &keys {
            redis_ops::unlink_queue(&mut conn, key).await?;
        }
        let s = self.tally.summary(|i| i >= n);
        let ms = |q: f64| quantile(&s.late_us, q).unwrap_or(0) as f64 / 1000.0;
        Ok(Herd {
            drain: Rate::new(n, drained.as_secs_f64()),
            trickle_per_s: per_s,
            trickle_messages: sent,
            trickle_p50_ms: ms(0.5),
            trickle_p99_ms: ms(0.99),
            trickle_max_ms: ms(1.0),
            duplicates: s.duplicates,
            cpu_seconds: cpu,
        })
    }
}
