//! Delivery reports: each record's outcome goes straight to the batch that sent it, on one
//! channel per batch, and wakes publishers waiting for room in librdkafka's queue.

use std::sync::atomic::{AtomicBool, Ordering};

use rdkafka::message::DeliveryResult;
use rdkafka::producer::ProducerContext;
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::Notify;

use super::health::HealthContext;
use super::publisher::classify;
use crate::sink::{Confirmed, Outcome, PublishError};

/// Where one record's delivery report goes: its batch's channel, at its position there.
///
/// A record librdkafka drops without a report (its producer destroyed) reports that on drop,
/// so a batch never waits for a report that cannot come.
pub struct Report {
    to: Option<UnboundedSender<(usize, Outcome)>>,
    position: usize,
}

impl Report {
    pub(super) fn new(to: &UnboundedSender<(usize, Outcome)>, position: usize) -> Box<Self> {
        Box::new(Self {
            to: Some(to.clone()),
            position,
        })
    }

    /// The record was never enqueued: its outcome is known without a report.
    pub(super) fn disarm(&mut self) {
        self.to = None;
    }

    fn send(&mut self, outcome: Outcome) {
        if let Some(to) = self.to.take() {
            // The batch stopped listening (timed out or aborted): nothing to tell.
            let _ = to.send((self.position, outcome));
        }
    }
}

impl Drop for Report {
    fn drop(&mut self) {
        self.send(Err(PublishError::Connection(
            "the producer dropped the record".into(),
        )));
    }
}

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

impl ProducerContext for HealthContext {
    type DeliveryOpaque = Box<Report>;

    fn delivery(&self, result: &DeliveryResult<'_>, mut report: Box<Report>) {
        report.send(match result {
            Ok(_) => Ok(Confirmed::by_broker()),
            Err((e, _)) => Err(classify(e)),
        });
        self.room.freed();
    }
}
