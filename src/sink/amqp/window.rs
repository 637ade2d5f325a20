//! The sink's window of unconfirmed messages (`max_unconfirmed`), shared fairly by the triggers publishing on it: each trigger asks for room one run at a time, so a trickle waits behind one run of a herd, not behind every run the herd's batches have asked for.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// One permit per message that may be published and not yet confirmed, and a turn per trigger.
pub(super) struct Window {
    permits: Arc<Semaphore>,
    /// Held by the one batch of a trigger waiting for room; its other batches wait here.
    turns: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Most room a batch takes at once.
    run: u32,
}

impl Window {
    /// A window of `max_unconfirmed` messages.
    pub(super) fn new(max_unconfirmed: usize) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(max_unconfirmed)),
            turns: Mutex::new(HashMap::new()),
            run: run(max_unconfirmed),
        }
    }

    /// Most room a batch takes at once ([`run`]).
    pub(super) fn run(&self) -> u32 {
        self.run
    }

    /// Room for `want` messages of a batch of `trigger`, once every batch of another trigger
    /// that asked before this one's turn came got its own; `None` never happens (the
    /// permits are never closed).
    pub(super) async fn room(&self, trigger: &str, want: u32) -> Option<OwnedSemaphorePermit> {
        let turn = self.turn(trigger);
        let _turn = turn.lock().await;
        self.permits.clone().acquire_many_owned(want).await.ok()
    }

    fn turn(&self, trigger: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut turns = self.turns.lock().unwrap_or_else(|e| e.into_inner());
        match turns.get(trigger) {
            Some(turn) => turn.clone(),
            None => {
                let turn = Arc::new(tokio::sync::Mutex::new(()));
                turns.insert(trigger.to_string(), turn.clone());
                turn
            }
        }
    }
}

/// Most room in a window of `max_unconfirmed` a batch takes at once: 64 messages, or a
/// quarter of the window so that four batches can fill it. A run goes out back to back on
/// the channel, and the broker confirms it with a few multiple-acks.
fn run(max_unconfirmed: usize) -> u32 {
    max_unconfirmed.div_ceil(4).clamp(1, 64) as u32
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_trickle_waits_behind_one_run_of_a_herd_not_all_of_them() {
        let window = Arc::new(Window::new(4));
        // The herd holds the whole window and has three more runs asking.
        let held = window.room("herd", 4).await.expect("room");
        let mut herd = Vec::new();
        for _ in 0..3 {
            let w = window.clone();
            herd.push(tokio::spawn(async move { w.room("herd", 4).await }));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        let w = window.clone();
        let trickle = tokio::spawn(async move { w.room("trickle", 1).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        // The window frees: the herd's first waiting run, then the trickle, before the rest.
        drop(held);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !trickle.is_finished(),
            "the herd's first waiting run goes first"
        );
        let granted: Vec<_> = herd.iter().filter(|h| h.is_finished()).collect();
        assert_eq!(granted.len(), 1, "one herd run took the window");
        drop(granted);
        let first = herd.remove(herd.iter().position(|h| h.is_finished()).unwrap());
        drop(first.await.unwrap());
        let got = tokio::time::timeout(Duration::from_secs(1), trickle).await;
        assert!(
            got.is_ok(),
            "the trickle gets room before the herd's other runs"
        );
        assert_eq!(herd.iter().filter(|h| h.is_finished()).count(), 0);
    }

    #[test]
    fn runs_are_a_quarter_of_the_window_up_to_64() {
        assert_eq!(run(256), 64);
        assert_eq!(run(1000), 64);
        assert_eq!(run(8), 2);
        assert_eq!(run(1), 1);
    }
}
