//! A trigger's workers: one worker's claim loop over its shards (pick a shard that may have
//! something due, claim, hand the batch to a delivery task, wait idle when none may), each
//! batch prepared, delivered in its own task and settled by a plan made from the sink's outcomes.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backoff::Backoff;
use crate::redis::store::ClaimBatch;
use crate::repeat::Repeated;
use crate::sink::{blame, Publisher};
use crate::trigger::{Pass, Route, Shard, Turn, Woken};
use batch::AdaptiveBatch;
use deliver::Verdict;

mod batch;
mod claim;
mod deliver;
mod json_pointer;
mod prepare;
mod publishing;
mod settlement;

pub(crate) use publishing::Publishing;

/// Batches one worker keeps publishing or confirming at once: it claims the next batch
/// while the broker confirms the previous ones.
pub const MAX_IN_FLIGHT: usize = 4;

/// Shortest wait for the rate limit's next token: below it, a low rate would cost one claim
/// per message.
const RATE_TICK: Duration = Duration::from_millis(10);

/// The wait after a failed Redis call or publisher, growing with the failures from 100 ms
/// to 5 s (jittered), for the workers and the dead-letter forwarder.
pub(crate) const ERROR_BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(100),
    max: Duration::from_secs(5),
};

/// What a worker does first, once the start-up gate is open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum First {
    /// Claim from each of its shards: a trigger's lead workers.
    Claim,
    /// Wait for a wake-up, like any idle worker: a shard's other workers, started by the
    /// claim that first found a backlog (which asked for one more worker).
    Wait,
}

/// Runs one worker over `shards` (one, or several that no other worker serves) until `stop`,
/// once `pass`'s start-up gate is open; `abort` cuts short the wait for confirmations at the
/// shutdown deadline.
pub(crate) async fn run(
    shards: Vec<Arc<Shard>>,
    worker: usize,
    first: First,
    pass: Pass,
    stop: CancellationToken,
    abort: CancellationToken,
) {
    let span = tracing::info_span!("worker", trigger = %shards[0].name(), worker);
    // No `Worker` local: one held across the await would be a second copy in the task.
    Worker::new(shards, worker, first, pass, stop, abort)
        .run()
        .instrument(span)
        .await
}

/// Which shards each of a trigger's `workers` serves: with no more shards than workers,
/// worker `w` serves shard `w mod shards` (alone or with other workers); with more, shard `s`
/// is served by worker `s mod workers` alone. The first `min(shards, workers)` workers start
/// at once; the others are started by their shard when it first has a backlog.
pub(crate) fn assign(shards: &[Arc<Shard>], workers: usize) -> Vec<Vec<Arc<Shard>>> {
    let workers = workers.max(1);
    if shards.len() <= workers {
        (0..workers)
            .map(|w| vec![shards[w % shards.len()].clone()])
            .collect()
    } else {
        (0..workers)
            .map(|w| shards.iter().skip(w).step_by(workers).cloned().collect())
            .collect()
    }
}

struct Worker {
    /// Position among the trigger's workers.
    id: usize,
    /// Every shard this worker serves; with more than one, no other worker serves them.
    served: Vec<Served>,
    /// Position in `served` of the shard claimed from last.
    current: usize,
    /// The start-up's gate and turns.
    pass: Pass,
    /// A turn among the first claims, while held.
    turn: Option<Turn>,
    batch: AdaptiveBatch,
    /// Consecutive batches that ended with the destination failing (held); the worker
    /// backs off by it.
    broken_batches: u32,
    publishing: Publishing,
    /// Failed claims.
    redis_failures: Repeated,
    /// Batches published and awaiting their confirmations.
    in_flight: JoinSet<Verdict>,
    stop: CancellationToken,
    abort: CancellationToken,
}

/// One of a worker's shards, as the worker knows it.
struct Served {
    shard: Arc<Shard>,
    /// It may have something due: a claim left more, a wake-up asked, or never looked at.
    ready: bool,
    /// Not claimed from yet: claims take turns with the bridge's other first claims.
    fresh: bool,
}

/// What a claim came to.
enum Claim {
    /// Members to deliver, claimed at this instant, and whether more is due.
    Batch(ClaimBatch, Instant, bool),
    /// Nothing to take (none due, or paused).
    Nothing,
    /// A failed claim's backoff, or the rate limit's wait.
    Wait(Duration),
}

/// What a worker does after a step.
enum Next {
    /// Pick a shard again at once.
    Claim,
    /// Wait idle: no shard may have anything due.
    Idle,
    /// Wait this long: a backoff, or the rate limit's next token.
    Wait(Duration),
}

impl Worker {
    fn new(
        shards: Vec<Arc<Shard>>,
        id: usize,
        first: First,
        pass: Pass,
        stop: CancellationToken,
        abort: CancellationToken,
    ) -> Self {
        let batch = AdaptiveBatch::new(shards[0].trigger().batch());
        let served = shards
            .into_iter()
            .map(|shard| Served {
                shard,
                ready: first == First::Claim,
                fresh: true,
            })
            .collect();
        Worker {
            id,
            served,
            current: 0,
            pass,
            turn: None,
            batch,
            broken_batches: 0,
            publishing: Publishing::default(),
            redis_failures: Repeated::default(),
            in_flight: JoinSet::new(),
            stop,
            abort,
        }
    }

    /// The shard claimed from last (or next).
    fn shard(&self) -> &Arc<Shard> {
        &self.served[self.current].shard
    }

    /// The lifecycle, one batch at a time: pick a shard that may have something due ->
    /// publisher -> claim -> deliver (in its own task, which publishes and settles) -> pick
    /// again while it confirms; wait idle when no shard may have anything due.
    async fn run(mut self) {
        Box::pin(self.pass.opened(&self.stop)).await;
        while !self.stop.is_cancelled() {
            if self.turn.is_none() && self.served.iter().any(|s| s.fresh && s.ready) {
                // Before the step is made: thousands of workers wait here at start.
                Box::pin(self.take_turn()).await;
            }
            // A step is boxed, made anew each time: the task holds the worker and what waiting
            // needs, not a step's publisher, claim and batch (an idle trigger holds this task
            // for as long as the bridge runs).
            match Box::pin(self.step()).await {
                Next::Claim => {}
                Next::Idle => Box::pin(self.idle()).await,
                Next::Wait(wait) => Box::pin(self.pause(wait)).await,
            }
        }
        self.finish().await;
    }

    /// Takes note of finished batches, picks a shard, gets a publisher, claims and hands the
    /// batch to its delivery task; says what to do next.
    async fn step(&mut self) -> Next {
        self.reap().await;
        if !self.pick().await {
            self.turn = None;
            return Next::Idle;
        }
        let Some(publisher) = self.publisher().await else {
            return Next::Claim;
        };
        let claimed = self.claim().await;
        self.turn = None;
        let served = &mut self.served[self.current];
        served.fresh = false;
        match claimed {
            Claim::Batch(batch, claimed_at, more) => {
                // Without more due, the claim took every member due: claiming again would
                // find none.
                served.ready = more;
                self.dispatch(publisher, batch, claimed_at).await;
                Next::Claim
            }
            Claim::Nothing => {
                served.ready = false;
                Next::Claim
            }
            Claim::Wait(wait) => Next::Wait(wait),
        }
    }

    /// Makes current the next shard after the current one that may have something due;
    /// `false` when none may. A shard not known to may is asked without waiting
    /// ([`Shard::poll`]), so that one woken while its worker claimed from another does not
    /// wait for that one's backlog to drain.
    async fn pick(&mut self) -> bool {
        for served in self.served.iter_mut().filter(|s| !s.ready) {
            if let Some(why) = served.shard.poll() {
                served.ready = why != Woken::Asked || served.shard.head_due().await;
            }
        }
        let n = self.served.len();
        let Some(i) = (1..=n)
            .map(|k| (self.current + k) % n)
            .find(|&i| self.served[i].ready)
        else {
            return false;
        };
        self.current = i;
        true
    }

    /// Waits until a wake-up asks one of the shards for a claim, or, for the worker holding
    /// a shard's gate, until its head is due or its guard passes ([`Shard::wait_idle`]). A
    /// request whose head is not due yet leaves the shard not ready ([`Shard::head_due`]).
    async fn idle(&mut self) {
        let stop = &self.stop;
        let waits = self
            .served
            .iter()
            .map(|s| Box::pin(s.shard.wait_idle(stop)));
        let (woken, i, _) = futures_util::future::select_all(waits).await;
        let ready = woken != Woken::Asked || self.served[i].shard.head_due().await;
        self.served[i].ready = ready;
    }

    /// Stopping: lets the batches in flight be confirmed (or aborted) and settled.
    async fn finish(&mut self) {
        while let Some(done) = self.in_flight.join_next().await {
            if let Err(e) = done {
                tracing::error!(error = %e, "a delivery task failed; its leases will be recovered");
            }
        }
    }

    /// Takes note of the batches that finished meanwhile.
    async fn reap(&mut self) {
        while let Some(done) = self.in_flight.try_join_next() {
            self.delivered(done).await;
        }
    }

    /// A usable publisher, or `None` after backing off while the sink is unavailable:
    /// nothing is claimed without one, so messages wait in Redis, not in the bridge.
    async fn publisher(&mut self) -> Option<Publisher> {
        let shard = self.shard().clone();
        let failed_before = self.publishing.failures.count() > 0;
        let e = match self
            .publishing
            .get(shard.sink(), shard.trigger().destination(), &self.stop)
            .await
        {
            Ok(p) => {
                if failed_before && p.is_some() {
                    // The destination that gave no publisher gives one again (the exchange
                    // exists, the broker is back): its hold ends.
                    shard.release(Route::Messages).await;
                }
                return p;
            }
            Err(e) => e,
        };
        if blame::holds_own(&e, blame::Chosen::default()) {
            shard.hold(Route::Messages, &e.to_string()).await;
        }
        // One worker per trigger speaks for all of them. While the broker is down the sink
        // logs the outage itself: here only its start, once per trigger.
        let failures = &mut self.publishing.failures;
        let sink_down = !shard.sink().is_up();
        if let Some(unlogged) = failures
            .failed()
            .filter(|_| self.id == 0 && !(sink_down && failures.count() > 1))
        {
            tracing::warn!(sink = %shard.sink().name(), error = %e,
                failures = failures.count(), unlogged, "sink unavailable, not claiming");
        }
        let wait = ERROR_BACKOFF.delay(failures.count());
        // A sink down at start must not hold a start-up turn through its backoff.
        self.turn = None;
        self.pause(wait).await;
        None
    }

    /// Waits for a turn among the workers starting at once (see [`Pass::turn`]).
    async fn take_turn(&mut self) {
        self.turn = self.pass.turn(&self.stop).await;
    }

    /// Delivers the batch in its own task, keeping at most [`MAX_IN_FLIGHT`] at once.
    async fn dispatch(&mut self, publisher: Publisher, batch: ClaimBatch, claimed_at: Instant) {
        let task = deliver::deliver(
            self.shard().clone(),
            publisher,
            batch,
            claimed_at,
            self.abort.clone(),
        );
        self.in_flight
            .spawn(task.instrument(tracing::Span::current()));
        while self.in_flight.len() >= MAX_IN_FLIGHT {
            if let Some(done) = self.in_flight.join_next().await {
                self.delivered(done).await;
            }
        }
    }

    /// Takes note of a finished batch: when the sink failed, drop the publisher and back off.
    async fn delivered(&mut self, done: Result<Verdict, tokio::task::JoinError>) {
        match done {
            Ok(Verdict::Settled) => self.broken_batches = 0,
            Ok(Verdict::Held { broken, refused }) => {
                self.broken_batches += 1;
                if let Some(broken) = broken {
                    self.publishing.current = None;
                    // A destination the broker refuses is no fault of the connection, which
                    // other triggers publish on: only a connection that keeps failing is
                    // made anew.
                    if self.broken_batches > 1 && !refused {
                        self.shard().sink().reset(&broken).await;
                    }
                } else if self.broken_batches > 1 && !refused {
                    // The sink took the batch and failed it all again (RabbitMQ's nacks) on
                    // a connection that stays up: the next batch goes out on a fresh
                    // publisher (see `Publisher::retire`).
                    if self.publishing.retire().await {
                        tracing::debug!(sink = %self.shard().sink().name(),
                            batches = self.broken_batches, "a held destination: a fresh channel");
                    }
                }
                // Capped: a held destination is tried again every few seconds at most, and
                // its head is not claimed in a hot loop meanwhile.
                self.pause(ERROR_BACKOFF.delay(self.broken_batches)).await;
            }
            Err(e) => {
                tracing::error!(error = %e, "a delivery task failed; its leases will be recovered");
            }
        }
    }

    /// Sleeps for `d` unless stopping.
    async fn pause(&self, d: Duration) {
        tokio::select! {
            _ = tokio::time::sleep(d) => {}
            _ = self.stop.cancelled() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio_util::sync::CancellationToken;

    use crate::trigger::Startup;

    /// Ten thousand idle triggers are ten thousand of these tasks for as long as the bridge
    /// runs: a worker's steps taken rarely (the start, a backoff) are boxed, so that its
    /// future is no larger than waiting needs.
    #[test]
    fn a_worker_task_stays_small() {
        let (stop, abort) = (CancellationToken::new(), CancellationToken::new());
        let pass = Startup::new(true).pass();
        let task = super::run(Vec::new(), 0, super::First::Claim, pass, stop, abort);
        let size = std::mem::size_of_val(&task);
        // 896 bytes in a debug build when this was written, 1,416 before the boxing.
        assert!(size <= 1_024, "a worker's future takes {size} bytes");
    }
}
