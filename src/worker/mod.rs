//! A trigger's workers: claim due members, hand each batch to a delivery task, sleep until the next head.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backoff::{jitter_down, Backoff};
use crate::redis::store::ClaimBatch;
use crate::repeat::Repeated;
use crate::sink::{blame, Publisher};

mod batch;
mod claim;
mod deliver;
mod hold;
mod prepare;
mod publishing;
mod route;
mod settlement;
mod shard;
mod timer;
mod wake;

use batch::AdaptiveBatch;
use deliver::Verdict;
pub(crate) use hold::Route;
pub(crate) use publishing::Publishing;
pub(crate) use shard::Shard;
use wake::Woken;

/// Runs one worker over `shards` (one, or several that no other worker serves) until
/// `stop`; `abort` cuts short the wait for confirmations at the shutdown deadline.
pub(crate) async fn run(
    shards: Vec<Arc<Shard>>,
    worker: usize,
    stop: CancellationToken,
    abort: CancellationToken,
) {
    let span = tracing::info_span!("worker", trigger = %shards[0].name(), worker);
    // No `Worker` local: one held across the await would be a second copy in the task.
    Worker::new(shards, worker, stop, abort)
        .run(false)
        .instrument(span)
        .await
}

/// [`run`], once `gate` is cancelled (or `stop` is): a trigger's lead workers wait for the
/// notification listener to subscribe, so that their first claims answer its wake-up.
pub(crate) async fn run_after(
    gate: CancellationToken,
    shards: Vec<Arc<Shard>>,
    worker: usize,
    stop: CancellationToken,
    abort: CancellationToken,
) {
    tokio::select! {
        _ = gate.cancelled() => {}
        _ = stop.cancelled() => {}
    }
    run(shards, worker, stop, abort).await
}

/// Runs one of a shard's deferred workers, started when the shard first had a backlog: like
/// any idle worker, it claims once a wake-up asks it to (the claim that found the backlog
/// asked for one more worker).
pub(crate) async fn run_deferred(
    shard: Arc<Shard>,
    worker: usize,
    stop: CancellationToken,
    abort: CancellationToken,
) {
    let span = tracing::info_span!("worker", trigger = %shard.name(), worker);
    Worker::new(vec![shard], worker, stop, abort)
        .run(true)
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
    /// The shard being claimed from.
    t: Arc<Shard>,
    /// Every shard this worker serves; with more than one, no other worker serves them.
    shards: Vec<Arc<Shard>>,
    /// With several shards: which may have something due (woken, due or never looked at).
    ready: Vec<bool>,
    /// With several shards: when each is looked at again however quiet it seems.
    guard_at: Vec<Instant>,
    /// Position of `t` in `shards`.
    current: usize,
    /// A turn among the first claims at start (see [`STARTING`]), while held.
    turn: Option<tokio::sync::SemaphorePermit<'static>>,
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

/// What a claim came to.
enum Claim {
    /// Members to deliver, claimed at this instant, and whether more is due.
    Batch(ClaimBatch, Instant, bool),
    /// Nothing to take (none due, or paused): wait idle.
    Nothing,
    /// A failed claim's backoff, or the rate limit's wait.
    Wait(Duration),
}

/// What a worker of one shard does after a step.
enum Next {
    /// Claim again at once.
    Claim,
    /// Wait idle for a wake-up (or, holding the gate, the head or the guard).
    Idle,
    /// Wait this long: a backoff, or the rate limit's next token.
    Wait(Duration),
}

/// Workers getting their first publisher and making their first claim at once, over the whole
/// bridge: with thousands of triggers, all of them at once would be a peak of memory that the
/// allocator keeps for good (measured: 133 against 119-122 MiB at 10,000 idle triggers).
static STARTING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(64);

/// Batches one worker keeps publishing or confirming at once: it claims the next batch
/// while the broker confirms the previous ones.
pub const MAX_IN_FLIGHT: usize = 4;

/// Shortest wait for the rate limit's next token: below it, a low rate would cost one claim
/// per message.
const RATE_TICK: Duration = Duration::from_millis(10);

pub(crate) const ERROR_BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(100),
    max: Duration::from_secs(5),
};

impl Worker {
    fn new(
        shards: Vec<Arc<Shard>>,
        id: usize,
        stop: CancellationToken,
        abort: CancellationToken,
    ) -> Self {
        let t = shards[0].clone();
        let batch = AdaptiveBatch::new(t.config.batch());
        let now = Instant::now();
        // Only a worker of several shards keeps track of each.
        let each = if shards.len() > 1 { shards.len() } else { 0 };
        Worker {
            id,
            t,
            ready: vec![true; each],
            guard_at: vec![now; each],
            shards,
            current: 0,
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

    /// The lifecycle, one batch at a time: publisher -> claim -> deliver (in its own task,
    /// which publishes and settles) -> claim again while it confirms. With `idle_first`, it
    /// waits for a wake-up before its first claim.
    async fn run(mut self, idle_first: bool) {
        if self.shards.len() > 1 {
            return Box::pin(self.run_shards()).await;
        }
        if idle_first {
            Box::pin(self.idle()).await;
        }
        let mut starting = true;
        while !self.stop.is_cancelled() {
            if starting {
                // Before the step is made: thousands of workers wait here at start.
                Box::pin(self.take_turn()).await;
            }
            // A step is boxed, made anew each time: the task holds the worker and what waiting
            // needs, not a step's publisher, claim and batch (an idle trigger holds this task
            // for as long as the bridge runs).
            match Box::pin(self.step(&mut starting)).await {
                Next::Claim => {}
                Next::Idle => Box::pin(self.idle()).await,
                Next::Wait(wait) => Box::pin(self.pause(wait)).await,
            }
        }
        self.finish().await;
    }

    /// Takes note of finished batches, then gets a publisher, claims and hands the batch to
    /// its delivery task; says what to do next.
    async fn step(&mut self, starting: &mut bool) -> Next {
        let Some(publisher) = self.begin_lap(false).await else {
            return Next::Claim;
        };
        let claimed = self.claim().await;
        *starting = false;
        self.turn = None;
        match claimed {
            Claim::Batch(batch, claimed_at, more) => {
                self.dispatch(publisher, batch, claimed_at).await;
                // Without more due, the claim took every member due: claiming again would
                // find none.
                if more {
                    Next::Claim
                } else {
                    Next::Idle
                }
            }
            Claim::Nothing => Next::Idle,
            Claim::Wait(wait) => Next::Wait(wait),
        }
    }

    /// The lifecycle over several shards: claim from each shard that may have something due
    /// in turn, and sleep until the earliest head or guard of them all, or a notification.
    async fn run_shards(mut self) {
        let mut starting = true;
        while !self.stop.is_cancelled() {
            let Some(publisher) = self.begin_lap(starting).await else {
                continue;
            };
            if !self.pick() {
                // Every shard was looked at once: the start is over for this worker.
                starting = false;
                Box::pin(self.idle_shards()).await;
                continue;
            }
            let claimed = Box::pin(self.claim()).await;
            self.turn = None;
            match claimed {
                Claim::Batch(batch, at, more) => {
                    self.ready[self.current] = more;
                    Box::pin(self.dispatch(publisher, batch, at)).await;
                }
                Claim::Nothing => self.ready[self.current] = false,
                Claim::Wait(wait) => Box::pin(self.pause(wait)).await,
            }
        }
        self.finish().await;
    }

    /// Stopping: lets the batches in flight be confirmed (or aborted) and settled.
    async fn finish(&mut self) {
        while let Some(done) = self.in_flight.join_next().await {
            if let Err(e) = done {
                tracing::error!(error = %e, "a delivery task failed; its leases will be recovered");
            }
        }
    }

    /// Makes the next shard after the current one that may have something due current; `false`
    /// when none may. A shard may when woken, when its head or its guard time has come.
    fn pick(&mut self) -> bool {
        let now = Instant::now();
        for (i, t) in self.shards.iter().enumerate() {
            if t.wakes.asked_alone()
                || self.guard_at[i] <= now
                || t.next_due().is_some_and(|due| due <= now)
            {
                self.ready[i] = true;
            }
        }
        let n = self.shards.len();
        let Some(i) = (1..=n)
            .map(|k| (self.current + k) % n)
            .find(|&i| self.ready[i])
        else {
            return false;
        };
        self.current = i;
        self.t = self.shards[i].clone();
        let guard = if self.t.is_paused() {
            self.t.config.guard_interval()
        } else {
            self.t.guard()
        };
        self.guard_at[i] = now + jitter_down(guard);
        true
    }

    /// Waits until a shard's head or guard time comes, or a notification wakes one of them.
    async fn idle_shards(&mut self) {
        let head = self.shards.iter().filter_map(|t| t.next_due()).min();
        let guard = self
            .guard_at
            .iter()
            .copied()
            .min()
            .unwrap_or_else(Instant::now);
        let woken =
            futures_util::future::select_all(self.shards.iter().map(|t| Box::pin(t.wakes.woken())));
        tokio::select! {
            _ = timer::head_or_guard(head, guard) => {}
            (_, i, _) = woken => {
                let t = &self.shards[i];
                if let Some(why) = t.wakes.should_claim() {
                    t.count_wake(why);
                    self.ready[i] = why != Woken::Asked || t.head_due().await;
                }
            }
            _ = self.stop.cancelled() => {}
        }
    }

    /// The start of a lap: takes note of finished batches, waits for a turn while starting,
    /// and gets a usable publisher (`None`: the sink was unavailable, look again).
    async fn begin_lap(&mut self, starting: bool) -> Option<Publisher> {
        Box::pin(self.reap()).await;
        if starting {
            self.take_turn().await;
        }
        Box::pin(self.publisher()).await
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
        let failed_before = self.publishing.failures.count() > 0;
        let e = match self
            .publishing
            .get(&self.t.sink, self.t.config.destination(), &self.stop)
            .await
        {
            Ok(p) => {
                if failed_before && p.is_some() {
                    // The destination that gave no publisher gives one again (the exchange
                    // exists, the broker is back): its hold ends.
                    self.t.hold.release(Route::Messages).await;
                }
                return p;
            }
            Err(e) => e,
        };
        if blame::holds_own(&e, blame::Chosen::default()) {
            self.t.hold.hold(Route::Messages, &e.to_string()).await;
        }
        // One worker per trigger speaks for all of them. While the broker is down the sink
        // logs the outage itself: here only its start, once per trigger.
        let failures = &mut self.publishing.failures;
        let sink_down = !self.t.sink.is_up();
        if let Some(unlogged) = failures
            .failed()
            .filter(|_| self.id == 0 && !(sink_down && failures.count() > 1))
        {
            tracing::warn!(sink = %self.t.sink.name(), error = %e,
                failures = failures.count(), unlogged, "sink unavailable, not claiming");
        }
        let wait = ERROR_BACKOFF.delay(failures.count());
        // A sink down at start must not hold a start-up turn through its backoff.
        self.turn = None;
        self.pause(wait).await;
        None
    }

    /// Waits for a turn among the workers starting at once (see [`STARTING`]), unless it
    /// holds one. The turn covers a publisher and a claim: it goes back after the claim, or
    /// before the backoff when the sink is down.
    async fn take_turn(&mut self) {
        if self.turn.is_none() {
            self.turn = tokio::select! {
                turn = STARTING.acquire() => turn.ok(),
                _ = self.stop.cancelled() => None,
            };
        }
    }

    /// Delivers the batch in its own task, keeping at most [`MAX_IN_FLIGHT`] at once.
    async fn dispatch(&mut self, publisher: Publisher, batch: ClaimBatch, claimed_at: Instant) {
        let task = deliver::deliver(
            self.t.clone(),
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
                        self.t.sink.reset(&broken).await;
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

    /// Waits until a wake-up asks for a claim, or, for the worker holding the shard's gate,
    /// until the head is due or the guard interval passes (see [`wake`]). A request whose
    /// head is not due yet is waited out without a claim ([`Shard::head_due`]).
    async fn idle(&self) {
        loop {
            let woken = self.wait_idle().await;
            if woken != Woken::Asked || self.t.head_due().await {
                return;
            }
        }
    }

    /// One idle wait: for a wake-up, or, holding the shard's gate, the head or the guard.
    async fn wait_idle(&self) -> Woken {
        let t = &self.t;
        let _gate = match t.wakes.gate_or_wake(&self.stop).await {
            Ok(gate) => gate,
            Err(woken) => {
                t.count_wake(woken);
                return woken;
            }
        };
        let guard = if t.is_paused() {
            t.config.guard_interval()
        } else {
            t.guard()
        };
        let guard_at = Instant::now() + jitter_down(guard);
        let woken = t.wakes.watch(guard_at, || t.is_paused(), &self.stop).await;
        t.count_wake(woken);
        woken
    }
}

#[cfg(test)]
mod tests {
    use tokio_util::sync::CancellationToken;

    /// Ten thousand idle triggers are ten thousand of these tasks for as long as the bridge
    /// runs: a worker's steps taken rarely (the start, a backoff) are boxed, so that its
    /// future is no larger than waiting needs.
    #[test]
    fn a_worker_task_stays_small() {
        let (gate, stop, abort) = (
            CancellationToken::new(),
            CancellationToken::new(),
            CancellationToken::new(),
        );
        let task = super::run_after(gate, Vec::new(), 0, stop, abort);
        let size = std::mem::size_of_val(&task);
        // 896 bytes in a debug build when this was written, 1,416 before the boxing.
        assert!(size <= 1_024, "a worker's future takes {size} bytes");
    }
}
