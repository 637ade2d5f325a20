//! A sink's window (RabbitMQ: messages not yet confirmed, `max_unconfirmed`; HTTP: requests in flight, `max_concurrency`), shared fairly by the triggers publishing on it: each trigger asks for room one run at a time, so a trickle waits behind one run of a herd, not behind every run the herd's batches have asked for.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A trigger's turn: held by the one run of the trigger waiting for room.
pub(super) type Turn = Arc<tokio::sync::Mutex<()>>;

/// One permit per message the sink may have out at once, and a turn per trigger.
pub(super) struct Window {
    permits: Arc<Semaphore>,
    /// Held by the one run of a trigger waiting for room; its other runs wait here.
    turns: Mutex<HashMap<String, Turn>>,
    /// The permits there are.
    size: usize,
}

impl Window {
    /// A window of `size` messages.
    pub(super) fn new(size: usize) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(size)),
            turns: Mutex::new(HashMap::new()),
            size,
        }
    }

    /// How many messages it holds.
    pub(super) fn size(&self) -> usize {
        self.size
    }

    /// Room for a run of `want` messages of `trigger`, once every run of another trigger
    /// that asked before this one's turn came got its own; `None` never happens (the
    /// permits are never closed).
    pub(super) async fn room(&self, trigger: &str, want: u32) -> Option<OwnedSemaphorePermit> {
        self.room_in(&self.turn(trigger), want).await
    }

    /// [`room`](Self::room) with the trigger's turn looked up already (see [`turn`](Self::turn)).
    pub(super) async fn room_in(&self, turn: &Turn, want: u32) -> Option<OwnedSemaphorePermit> {
        let _turn = turn.lock().await;
        self.permits.clone().acquire_many_owned(want).await.ok()
    }

    /// The turn of `trigger`, for asking room for several runs without looking it up each time.
    pub(super) fn turn(&self, trigger: &str) -> Turn {
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
}
