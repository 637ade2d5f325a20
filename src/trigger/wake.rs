//! Wake-ups of a shard's idle workers: each event wakes one, a claim covers every request made
//! before it, and one idle worker keeps the head's timer and the guard.
//!
//! The rule: a keyspace notification (or a settle, a recovery, a resume) asks for a claim
//! that starts after it, and wakes one idle worker; a claim that starts later, by any worker,
//! answers every request made so far, so a woken worker whose request was answered meanwhile
//! goes back to sleep. A claim that came back full asks for one more worker, whatever else
//! claims. The head's due time wakes only the worker holding the gate, which takes that due
//! time for itself: another worker reaching the gate before the claim's reply waits for the
//! new head instead of claiming the same members again. The guard is the shard's: a guard
//! interval after the last claim's reply, whichever worker made it, the holder claims however
//! quiet the shard seems, and takes the guard for itself as it takes the head.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::time::Duration;

use tokio::sync::{Mutex, MutexGuard, Notify};
use tokio::time::Instant;

/// A shard's wake-up state, shared by its workers.
#[derive(Default)]
pub(super) struct Wakes {
    /// One idle worker per `notify_one`.
    idle: Notify,
    /// The gate's holder reads the head and the pause again: the head moved earlier, or a
    /// resume.
    rearm: Notify,
    /// Requests for a claim that any claim starting later answers.
    asked: AtomicU64,
    /// The last request a claim was started after.
    answered: AtomicU64,
    /// A claim came back full: one more worker should claim.
    help: AtomicBool,
    /// Only one idle worker watches the head and the guard; the rest wait for a wake-up.
    gate: Mutex<()>,
    /// When the earliest known member becomes due, in local monotonic time; `None` while
    /// unknown or while a claim that took it is on its way.
    next_due: std::sync::Mutex<Option<Instant>>,
    /// When the gate's holder claims however quiet the shard seems: set by each claim's reply,
    /// `None` once taken (the claim it leads to sets the next) or before any claim.
    guard_at: std::sync::Mutex<Option<Instant>>,
    /// The Redis clock (epoch µs) as the last claim's reply gave it, and the instant the
    /// reply arrived: a due time dated by it is a little late, never early.
    clock: std::sync::Mutex<Option<(Instant, i64)>>,
}

/// How long the Redis clock of a claim dates a head read without a claim: an older one is
/// not trusted (the clocks may have drifted apart), and the woken worker claims instead.
const CLOCK_FRESH: Duration = Duration::from_secs(10);

/// When a member scored `score` (epoch ms) becomes due, given that the Redis clock read
/// `now_us` (epoch µs) at `at` or a little before.
pub(super) fn due_by(at: Instant, now_us: i64, score: f64) -> Instant {
    let wait_us = (score * 1000.0 - now_us as f64).max(0.0);
    at + Duration::from_micros(wait_us.min(1e15) as u64)
}

/// Why an idle worker stopped waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Woken {
    /// A request no claim has answered yet (a notification, a settle, a resume).
    Asked,
    /// A peer's claim came back full.
    Help,
    /// The head is due, or the guard interval passed: only the gate's holder.
    Timer,
    /// Stopping.
    Stop,
}

impl Wakes {
    /// Asks for a claim after this instant and wakes one idle worker for it.
    pub(super) fn ask(&self) {
        self.asked.fetch_add(1, SeqCst);
        self.idle.notify_one();
    }

    /// A claim came back full: one more idle worker claims.
    pub(super) fn help(&self) {
        self.help.store(true, SeqCst);
        self.idle.notify_one();
    }

    /// A claim came back short: the backlog is drained and a help request still pending
    /// would only find nothing.
    pub(super) fn drained(&self) {
        self.help.store(false, SeqCst);
    }

    /// A claim is about to be sent: it answers every request made so far. True when some
    /// request was not answered yet.
    pub(super) fn claiming(&self) -> bool {
        let asked = self.asked.load(SeqCst);
        self.answered.fetch_max(asked, SeqCst) < asked
    }

    /// Whether an idle worker should claim now, and why: a help request (taken), or a
    /// request that no claim answers (then this claim will).
    pub(super) fn should_claim(&self) -> Option<Woken> {
        if self.help.swap(false, SeqCst) {
            Some(Woken::Help)
        } else if self.claiming() {
            Some(Woken::Asked)
        } else {
            None
        }
    }

    /// A resume: the gate's holder stops its paused wait and a worker claims.
    pub(super) fn resumed(&self) {
        self.ask();
        self.rearm.notify_waiters();
    }

    /// When the earliest known member becomes due.
    pub(super) fn next_due(&self) -> Option<Instant> {
        *self.next_due.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records the head a claim reported (`None`: none, or the claimer takes it itself);
    /// the gate's holder looks again when it moved earlier.
    pub(super) fn note_head(&self, due: Option<Instant>) {
        let mut next = self.next_due.lock().unwrap_or_else(|e| e.into_inner());
        let earlier = match (*next, due) {
            (Some(old), Some(new)) => new < old,
            (None, Some(_)) => true,
            _ => false,
        };
        *next = due;
        drop(next);
        if earlier {
            self.rearm.notify_waiters();
        }
    }

    /// A claim's reply, arrived at `at`, read the Redis clock at `now_us`.
    pub(super) fn set_clock(&self, at: Instant, now_us: i64) {
        *self.clock.lock().unwrap_or_else(|e| e.into_inner()) = Some((at, now_us));
    }

    /// The last claim's clock (the instant its reply arrived, the Redis clock in µs), unless
    /// older than [`CLOCK_FRESH`].
    pub(super) fn fresh_clock(&self) -> Option<(Instant, i64)> {
        let clock = *self.clock.lock().unwrap_or_else(|e| e.into_inner());
        clock.filter(|(at, _)| at.elapsed() <= CLOCK_FRESH)
    }

    /// Records a head read without a claim: it can only move the expected head earlier, so
    /// that a read overtaken by a claim's reply never hides an earlier head.
    pub(super) fn note_earlier(&self, due: Instant) {
        let mut next = self.next_due.lock().unwrap_or_else(|e| e.into_inner());
        if next.is_some_and(|old| old <= due) {
            return;
        }
        *next = Some(due);
        drop(next);
        self.rearm.notify_waiters();
    }

    /// Takes the head's due time when it has come: the caller claims it, and no other
    /// worker claims for it until a claim reports the next head.
    fn take_due(&self, now: Instant) -> bool {
        let mut next = self.next_due.lock().unwrap_or_else(|e| e.into_inner());
        if next.is_some_and(|due| due <= now) {
            *next = None;
            return true;
        }
        false
    }

    /// A claim's reply: the shard is claimed from again by `at` however quiet it seems.
    pub(super) fn guard_until(&self, at: Instant) {
        *self.guard_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(at);
    }

    /// When the guard passes: `fallback()` when no claim set it (then it is set to that).
    fn guard_at(&self, fallback: impl FnOnce() -> Instant) -> Instant {
        *self
            .guard_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(fallback)
    }

    /// Takes the guard when it has passed: the caller claims, and no other worker claims for
    /// it until that claim's reply sets the next.
    fn take_guard(&self, now: Instant) -> bool {
        let mut guard = self.guard_at.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_some_and(|at| at <= now) {
            *guard = None;
            return true;
        }
        false
    }

    /// Without waiting, what an idle wait would find at once: a request or a help (a stored
    /// wake-up is taken), the head due (unless `paused`), or the guard passed.
    pub(super) fn poll(&self, now: Instant, paused: bool) -> Option<Woken> {
        let _ = futures_util::FutureExt::now_or_never(self.idle.notified());
        if let Some(why) = self.should_claim() {
            return Some(why);
        }
        let timer = (!paused && self.take_due(now)) || self.take_guard(now);
        timer.then_some(Woken::Timer)
    }

    /// Waits for the gate or a reason to claim without it.
    pub(super) async fn gate_or_wake(
        &self,
        stop: &tokio_util::sync::CancellationToken,
    ) -> Result<MutexGuard<'_, ()>, Woken> {
        let lock = self.gate.lock();
        tokio::pin!(lock);
        loop {
            let woken = self.idle.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if let Some(why) = self.should_claim() {
                return Err(why);
            }
            tokio::select! {
                g = &mut lock => return Ok(g),
                _ = &mut woken => {}
                _ = stop.cancelled() => return Err(Woken::Stop),
            }
        }
    }

    /// The gate's holder: waits until the head is due, the guard passes, a wake-up, or stop.
    /// While `paused()` says so, only until the guard, a resume or stop: producers keep
    /// writing to a paused queue, and their wake-ups would only make claims that take nothing.
    /// `guard()` is the guard's time when no claim set one.
    pub(super) async fn watch(
        &self,
        guard: impl Fn() -> Instant,
        paused: impl Fn() -> bool,
        stop: &tokio_util::sync::CancellationToken,
    ) -> Woken {
        loop {
            let rearm = self.rearm.notified();
            tokio::pin!(rearm);
            rearm.as_mut().enable();
            let guard_at = self.guard_at(&guard);
            if paused() {
                if self.take_guard(Instant::now()) {
                    return Woken::Timer;
                }
                tokio::select! {
                    _ = tokio::time::sleep_until(guard_at) => continue,
                    _ = &mut rearm => continue,
                    _ = stop.cancelled() => return Woken::Stop,
                }
            }
            let woken = self.idle.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if let Some(why) = self.should_claim() {
                return why;
            }
            let now = Instant::now();
            if self.take_guard(now) || self.take_due(now) {
                return Woken::Timer;
            }
            tokio::select! {
                _ = super::timer::head_or_guard(self.next_due(), guard_at) => {}
                _ = &mut woken => {}
                _ = &mut rearm => {}
                _ = stop.cancelled() => return Woken::Stop,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio_util::sync::CancellationToken;

    #[test]
    fn a_claim_answers_every_request_made_before_it() {
        let w = Wakes::default();
        w.ask();
        w.ask();
        assert!(w.claiming(), "two requests, no claim yet");
        assert!(!w.claiming(), "the first claim answered both");
        assert_eq!(w.should_claim(), None);
        w.ask();
        assert_eq!(w.should_claim(), Some(Woken::Asked));
        assert_eq!(w.should_claim(), None, "taken by the first worker woken");
    }

    #[test]
    fn help_is_taken_once_and_dropped_when_the_backlog_is_drained() {
        let w = Wakes::default();
        w.help();
        assert!(!w.claiming(), "help is no request a claim answers");
        assert_eq!(w.should_claim(), Some(Woken::Help));
        assert_eq!(w.should_claim(), None);
        w.help();
        w.drained();
        assert_eq!(w.should_claim(), None);
    }

    #[test]
    fn the_due_head_is_taken_by_one_worker() {
        let w = Wakes::default();
        let now = Instant::now();
        w.note_head(Some(now + Duration::from_secs(1)));
        assert!(!w.take_due(now));
        w.note_head(Some(now));
        assert!(w.take_due(now));
        assert!(
            !w.take_due(now),
            "taken already: the next head comes with the claim's reply"
        );
        assert_eq!(w.next_due(), None);
    }

    #[test]
    fn the_guard_is_set_by_each_claim_and_taken_by_one_worker() {
        let w = Wakes::default();
        let now = Instant::now();
        w.guard_until(now + Duration::from_secs(1));
        assert_eq!(w.poll(now, false), None);
        w.guard_until(now);
        assert_eq!(w.poll(now, false), Some(Woken::Timer));
        assert_eq!(
            w.poll(now, false),
            None,
            "taken already: the next guard comes with the claim's reply"
        );
        w.note_head(Some(now));
        assert_eq!(w.poll(now, true), None, "paused: the head waits");
        assert_eq!(w.poll(now, false), Some(Woken::Timer));
    }

    /// Waits as the gate's holder, with a minute's guard; fails after ten seconds.
    async fn watch(w: &Wakes, paused: impl Fn() -> bool) -> Woken {
        let guard = Instant::now() + Duration::from_secs(60);
        let stop = CancellationToken::new();
        tokio::time::timeout(Duration::from_secs(10), w.watch(|| guard, paused, &stop))
            .await
            .expect("woken within ten seconds")
    }

    #[tokio::test]
    async fn the_holder_wakes_at_the_head_or_for_a_request() {
        let w = std::sync::Arc::new(Wakes::default());
        let start = Instant::now();
        w.note_head(Some(start + Duration::from_millis(30)));
        assert_eq!(watch(&w, || false).await, Woken::Timer);
        assert!(start.elapsed() >= Duration::from_millis(30));
        assert_eq!(w.next_due(), None, "the holder took the head");
        let waker = w.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            waker.ask();
        });
        assert_eq!(watch(&w, || false).await, Woken::Asked);
    }

    #[tokio::test]
    async fn a_paused_holder_ignores_requests_until_a_resume() {
        let w = std::sync::Arc::new(Wakes::default());
        let start = Instant::now();
        let paused = std::sync::Arc::new(AtomicBool::new(true));
        let (waker, flag) = (w.clone(), paused.clone());
        tokio::spawn(async move {
            waker.ask();
            tokio::time::sleep(Duration::from_millis(50)).await;
            flag.store(false, SeqCst);
            waker.resumed();
        });
        assert_eq!(watch(&w, || paused.load(SeqCst)).await, Woken::Asked);
        assert!(start.elapsed() >= Duration::from_millis(50));
    }

    #[tokio::test]
    async fn an_earlier_head_rearms_the_holder() {
        let w = std::sync::Arc::new(Wakes::default());
        let start = Instant::now();
        let waker = w.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            waker.note_head(Some(start + Duration::from_millis(40)));
        });
        assert_eq!(watch(&w, || false).await, Woken::Timer);
        assert!(start.elapsed() >= Duration::from_millis(40));
    }

    #[tokio::test]
    async fn one_request_wakes_one_of_several_idle_workers() {
        let w = std::sync::Arc::new(Wakes::default());
        let stop = CancellationToken::new();
        let holder = w.gate.lock().await;
        let woken = std::sync::Arc::new(AtomicU64::new(0));
        let mut idle = tokio::task::JoinSet::new();
        for _ in 0..3 {
            let (w, stop, woken) = (w.clone(), stop.clone(), woken.clone());
            idle.spawn(async move {
                if matches!(w.gate_or_wake(&stop).await, Err(Woken::Asked)) {
                    woken.fetch_add(1, SeqCst);
                }
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        w.ask();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(woken.load(SeqCst), 1);
        drop(holder);
        stop.cancel();
        while idle.join_next().await.is_some() {}
    }
}
