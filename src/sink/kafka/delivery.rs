//! Delivery reports: each record's outcome goes straight to the batch that sent it, on one
//! channel per batch, and wakes publishers waiting for room in librdkafka's queue.

use rdkafka::message::DeliveryResult;
use rdkafka::producer::ProducerContext;
use tokio::sync::mpsc::UnboundedSender;

use super::context::HealthContext;
use super::errors::classify;
use crate::sink::{Confirmed, Outcome, PublishError};

/// Where one record's delivery report goes: its batch's channel, at its position there.
///
/// A record librdkafka drops without a report (its producer destroyed) reports that on drop,
/// so a batch never waits for a report that cannot come.
pub(super) struct Report {
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
