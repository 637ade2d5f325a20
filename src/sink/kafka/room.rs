//! Room in librdkafka's queue, shared by every worker of a sink: a publisher that found the
//! queue full waits for the next delivery report.

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

/// Room in librdkafka's queue (shared by every worker of the sink): a publisher that found it
/// full waits for the next delivery report.
#[derive(Default)]
pub(super) struct Room {
    freed: Notify,
    /// Some publisher waits: only then does a report take the notifier's lock.
    waiting: AtomicBool,
}

impl Room {
    /// Registers a waiter for the next report; register before trying again, so a report
    /// arriving in between is not missed.
    pub(super) fn wait(&self) -> std::pin::Pin<Box<tokio::sync::futures::Notified<'_>>> {
        let mut freed = Box::pin(self.freed.notified());
        freed.as_mut().enable();
        self.waiting.store(true, Ordering::SeqCst);
        freed
    }

    /// A report came in: wake the waiting publishers, if any.
    pub(super) fn freed(&self) {
        if self.waiting.load(Ordering::Relaxed) && self.waiting.swap(false, Ordering::SeqCst) {
            self.freed.notify_waiters();
        }
    }

    /// Wakes every waiting publisher (a new producer has an empty queue).
    pub(super) fn reset(&self) {
        self.waiting.store(false, Ordering::SeqCst);
        self.freed.notify_waiters();
    }
}
