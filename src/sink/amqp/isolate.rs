//! Finding the message the broker refuses: after RabbitMQ closed a batch's channel or
//! connection, the unconfirmed members are published again one at a time.
//!
//! A close fails every confirmation still pending on the channel (or on every channel of the
//! connection), the culprit's and its innocent neighbours' alike, and the reply code does not
//! say whose fault it was (403 is a routing key outside the user's topic permissions as much
//! as permissions revoked for all of them; 404 a deleted exchange). The effect says it: a
//! message the broker refuses alone on both sides of another message's confirmation is
//! refused for what it is (`BrokerRefused`: an attempt, then a dead letter; see
//! [`refused`](super::refused)); while nothing goes through, alone or together, the sink
//! refuses every message (`SinkRefused`: put back without an attempt, and the worker backs
//! off).

use lapin::options::ConfirmSelectOptions;
use lapin::{Channel, Connection};
use tokio_util::sync::CancellationToken;

use super::publisher::{confirmation, properties, AmqpPublisher, Target, MANDATORY};
use super::refused::Verdict;
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
    /// each ends confirmed, `BrokerRefused`, `SinkRefused`, or put back (`Connection`) when
    /// the broker could not be reached or time ran out. Nothing happens when no close was
    /// reported (a dropped connection says nothing of the messages).
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

    /// Publishes each of `suspects` alone (see [`Alone`]). A refusal is judged by
    /// [`Refused`](super::refused::Refused): unproven ones are tried alone once more at the
    /// end of the pass if another message went through since, and what is still unproven is
    /// the sink's, for now (put back without an attempt).
    async fn one_by_one(
        &self,
        target: &Target<'_>,
        messages: &[OutMessage<'_>],
        suspects: Vec<usize>,
        results: &mut [Outcome],
        confirms: Option<&Confirms>,
    ) {
        let mut alone = Alone::default();
        // Refused and not yet proven: index, reply, the clock when refused.
        let mut unproven: Vec<(usize, u16, String, u64)> = Vec::new();
        for i in suspects {
            match alone.publish(self, target, &messages[i]).await {
                Ok(c) => {
                    self.taken.add(1);
                    record_outcome(results, i, Ok(c), confirms);
                }
                Err(PublishError::Closed { code, text }) => {
                    let taken = self.taken.now();
                    match self.refused.judge(messages[i].id, taken) {
                        Verdict::Culprit => {
                            results[i] = Err(PublishError::BrokerRefused { code, text })
                        }
                        Verdict::Unproven => unproven.push((i, code, text, taken)),
                    }
                }
                Err(e) => results[i] = Err(e),
            }
        }
        for (i, code, text, taken) in unproven {
            let again = if self.taken.now() > taken {
                alone.publish(self, target, &messages[i]).await
            } else {
                Err(PublishError::Closed { code, text })
            };
            let outcome = match again {
                Ok(c) => {
                    self.taken.add(1);
                    Ok(c)
                }
                Err(PublishError::Closed { code, text }) => {
                    match self.refused.judge(messages[i].id, self.taken.now()) {
                        Verdict::Culprit => Err(PublishError::BrokerRefused { code, text }),
                        Verdict::Unproven => Err(PublishError::SinkRefused { code, text }),
                    }
                }
                Err(e) => Err(e),
            };
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
                properties(target.trigger, m),
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
