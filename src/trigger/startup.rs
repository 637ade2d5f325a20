//! The start-up gate: triggers started together claim once the notification listener has
//! subscribed, and the first claims over the whole bridge take turns.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// Workers getting their first publisher and making their first claim at once, over the whole
/// bridge: with thousands of triggers, all of them at once would be a peak of memory that the
/// allocator keeps for good (measured: 133 against 119-122 MiB at 10,000 idle triggers).
const TURNS: usize = 64;

/// A bridge's start-up gate, renewed with each notification listener. Triggers started while
/// it is closed wait for it: their first claims then come after the listener's wake-up of
/// every trigger, which those claims answer, instead of a second round of claims.
pub(crate) struct Startup {
    /// Cancelled once the listener has subscribed (or failed to, or there is none).
    listening: CancellationToken,
    /// Whether there is a listener to wait for.
    notifications: bool,
    /// The turns among the first claims.
    turns: Arc<Semaphore>,
}

/// What a trigger's workers hold of the start-up: the gate they wait for, and the turns.
#[derive(Clone)]
pub(crate) struct Pass {
    gate: CancellationToken,
    turns: Arc<Semaphore>,
}

/// A turn among the first claims, given back when dropped.
pub(crate) type Turn = OwnedSemaphorePermit;

impl Startup {
    /// A gate for the triggers started until the first listener subscribes (open at once
    /// without notifications).
    pub(crate) fn new(notifications: bool) -> Self {
        let startup = Self {
            listening: CancellationToken::new(),
            notifications,
            turns: Arc::new(Semaphore::new(TURNS)),
        };
        if !notifications {
            startup.open();
        }
        startup
    }

    /// A new gate for the triggers started until the next listener subscribes. The last one
    /// opens: its triggers must not wait for a listener that may not come.
    pub(crate) fn renew(&mut self) {
        self.open();
        self.listening = CancellationToken::new();
        if !self.notifications {
            self.open();
        }
    }

    /// Opens the gate now (a trigger failed to start: those started so far claim).
    pub(crate) fn open(&self) {
        self.listening.cancel();
    }

    /// What the listener cancels once it has subscribed (or failed to).
    pub(crate) fn listening(&self) -> CancellationToken {
        self.listening.clone()
    }

    /// What the workers of a trigger started now hold.
    pub(crate) fn pass(&self) -> Pass {
        Pass {
            gate: self.listening.clone(),
            turns: self.turns.clone(),
        }
    }
}

impl Pass {
    /// Waits until the gate is open, or `stop`.
    pub(crate) async fn opened(&self, stop: &CancellationToken) {
        tokio::select! {
            _ = self.gate.cancelled() => {}
            _ = stop.cancelled() => {}
        }
    }

    /// Waits for a turn among the first claims; `None` when stopping. The turn covers a
    /// publisher and a claim: the worker drops it after the claim, or before backing off
    /// when the sink is down.
    pub(crate) async fn turn(&self, stop: &CancellationToken) -> Option<Turn> {
        tokio::select! {
            turn = self.turns.clone().acquire_owned() => turn.ok(),
            _ = stop.cancelled() => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_renewed_gate_opens_the_last_and_waits_for_the_next_listener() {
        let mut startup = Startup::new(true);
        let stop = CancellationToken::new();
        let first = startup.pass();
        startup.renew();
        let second = startup.pass();
        first.opened(&stop).await;
        assert!(
            futures_util::FutureExt::now_or_never(second.opened(&stop)).is_none(),
            "closed until the listener subscribes"
        );
        startup.listening().cancel();
        second.opened(&stop).await;
        let open = Startup::new(false).pass();
        open.opened(&stop).await;
    }

    #[tokio::test]
    async fn turns_are_shared_and_given_back() {
        let startup = Startup::new(false);
        let (a, b) = (startup.pass(), startup.pass());
        let stop = CancellationToken::new();
        let all = || futures_util::future::join_all((0..TURNS).map(|_| a.turn(&stop)));
        let held: Vec<Turn> = all().await.into_iter().flatten().collect();
        assert_eq!(held.len(), TURNS);
        assert!(futures_util::FutureExt::now_or_never(b.turn(&stop)).is_none());
        drop(held);
        assert!(b.turn(&stop).await.is_some(), "given back when dropped");
        let _held = all().await;
        stop.cancel();
        assert!(b.turn(&stop).await.is_none(), "none while stopping");
    }
}
