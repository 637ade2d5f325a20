//! Whose fault a close is: after RabbitMQ closed a batch's channel or connection, the
//! unconfirmed members are published again one at a time.
//!
//! A close fails every confirmation still pending on the channel (or on every channel of the
//! connection), the culprit's and its innocent neighbours' alike. Published alone, each
//! message gets the broker's own answer: a 406 or a frame error is the message's (an
//! attempt, see [`crate::sink::blame`]); a 404 is the exchange's, a 403 the exchange's or,
//! when the broker names a topic, the routing key's (the message's own when it chose it).
//! Nothing is inferred from what else was confirmed meanwhile. Once the trigger's own
//! destination refuses a message alone, the rest go back untried: they would meet the same.

use lapin::options::ConfirmSelectOptions;
use lapin::{Channel, Connection};
use tokio_util::sync::CancellationToken;

use super::publisher::{confirmation, properties, AmqpPublisher, Target, MANDATORY};
use crate::sink::blame::{self, Chosen, Part};
use crate::sink::{record_outcome, Confirms, OutMessage, Outcome, PublishError};

/// True when `r` is a member the close may have failed without its fault: to be tried again.
fn suspect(r: &Outcome) -> bool {
    matches!(
        r,
        Err(PublishError::Closed { .. } | PublishError::Connection(_) | PublishError::Timeout)
    )
}

/// The first close the broker reported among `results`.
fn close_of(results: &[Outcome]) -> Option<(u16, String)> {
    results.iter().find_map(|r| match r {
        Err(PublishError::Closed { code, text }) => Some((*code, text.clone())),
        _ => None,
    })
}

impl AmqpPublisher {
    /// Sorts out the members a broker-side close left unanswered (see the module's doc):
    /// each ends confirmed, `BrokerRefused`, `DestinationRefused`, or put back
    /// (`Connection`) when the broker could not be reached or time ran out. Nothing happens
    /// when no close was reported (a dropped connection says nothing of the messages).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn isolate(
        &self,
        target: &Target<'_>,
        messages: &[OutMessage<'_>],
        results: &mut [Outcome],
        deadline: tokio::time::Instant,
        abort: &CancellationToken,
        confirms: Option<&Confirms>,
    ) {
        // The broker closed the channel (the connection still stands) or said why it closed
        // the connection; a connection lost without a word says nothing of the messages.
        let closed_by_broker = self.conn.status().connected() || close_of(results).is_some();
        if self.channel_open() || !closed_by_broker {
            return;
        }
        let suspects: Vec<usize> = (0..results.len())
            .filter(|&i| suspect(&results[i]))
            .collect();
        if suspects.is_empty() {
            return;
        }
        let work = self.one_by_one(target, messages, suspects, results, confirms);
        tokio::select! {
            _ = work => {}
            _ = tokio::time::sleep_until(deadline) => {}
            _ = abort.cancelled() => {}
        }
        // What is still unsorted (time ran out, the broker went away) goes back untried.
        for r in results.iter_mut() {
            if matches!(r, Err(PublishError::Closed { .. } | PublishError::Timeout)) {
                *r = Err(PublishError::Connection(
                    "the broker closed the channel; not yet published alone".into(),
                ));
            }
        }
    }

    /// Publishes each of `suspects` alone (see [`Alone`]), judging each close by what the
    /// broker said of that message.
    async fn one_by_one(
        &self,
        target: &Target<'_>,
        messages: &[OutMessage<'_>],
        suspects: Vec<usize>,
        results: &mut [Outcome],
        confirms: Option<&Confirms>,
    ) {
        let mut alone = Alone::default();
        let mut own_refused: Option<PublishError> = None;
        for i in suspects {
            if let Some(refusal) = &own_refused {
                // The trigger's destination refuses: the rest would meet the same.
                results[i] = Err(refusal.clone());
                continue;
            }
            let outcome = match alone.publish(self, target, &messages[i]).await {
                Err(PublishError::Closed { code, text }) => Err(refusal(code, text)),
                other => other,
            };
            if let Err(e) = &outcome {
                if blame::holds_own(e, Chosen::of(&messages[i])) {
                    own_refused = Some(e.clone());
                }
            }
            record_outcome(results, i, outcome, confirms);
        }
        alone.close().await;
    }

    /// A new confirm-mode channel on the publisher's own connection (opened, or opened
    /// again, as needed). A failure says nothing of the message it was for: it did not go out.
    async fn fresh_channel(
        &self,
        private: &mut Option<Connection>,
    ) -> Result<Channel, PublishError> {
        if !private.as_ref().is_some_and(|c| c.status().connected()) {
            let opened = self
                .connector
                .open_private("/isolating")
                .await
                .map_err(PublishError::Connection)?;
            *private = Some(opened);
        }
        let conn = private.as_ref().expect("just opened");
        let ch = conn.create_channel().await.map_err(unsent)?;
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(unsent)?;
        Ok(ch)
    }
}

/// What the broker's close of a channel says of a message published alone on it.
pub(super) fn refusal(code: u16, text: String) -> PublishError {
    let part = match code {
        // PRECONDITION_FAILED (too large for `max_message_size`...), frame and syntax errors:
        // the message itself.
        406 | 501..=505 => return PublishError::BrokerRefused { code, text },
        404 => Part::Exchange,
        // RabbitMQ names the topic when only the routing key is refused.
        403 if text.contains("to topic") => Part::RoutingKey,
        403 => Part::Exchange,
        _ => Part::Sink,
    };
    PublishError::DestinationRefused { code, text, part }
}

/// A message refused before it went out (the channel or the connection was gone already, or
/// could not be opened): nothing is known of it, it goes back untried.
fn unsent(e: lapin::Error) -> PublishError {
    PublishError::Connection(e.to_string())
}

/// One message at a time: on a channel with nothing else unconfirmed, the next one sent
/// only once the last is answered, so that a close is this message's and no frame follows it
/// (frames on a channel the broker has closed make it close the whole connection). On a
/// connection of the publisher's own: on the shared one, another publisher's frames can make
/// the broker close the whole connection, which would be blamed on this message.
#[derive(Default)]
struct Alone {
    private: Option<Connection>,
    channel: Option<Channel>,
}

impl Alone {
    async fn publish(
        &mut self,
        publisher: &AmqpPublisher,
        target: &Target<'_>,
        m: &OutMessage<'_>,
    ) -> Outcome {
        let ch = match self.channel.take().filter(|c| c.status().connected()) {
            Some(c) => c,
            None => publisher.fresh_channel(&mut self.private).await?,
        };
        let sent = ch
            .basic_publish(
                target.exchange,
                m.routing_key.unwrap_or(target.routing_key),
                MANDATORY,
                m.payload,
                properties(target.trigger, m, super::answers::next_publish()),
            )
            .await;
        let outcome = match sent {
            Ok(confirm) => confirmation(confirm.await),
            Err(e) => Err(unsent(e)),
        };
        self.channel = Some(ch);
        outcome
    }

    async fn close(self) {
        if let Some(ch) = self.channel.filter(|c| c.status().connected()) {
            let _ = ch.close(200, "isolated").await;
        }
        if let Some(conn) = self.private {
            let _ = conn.close(200, "isolated").await;
        }
    }
}
