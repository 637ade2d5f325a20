//! A worker's RabbitMQ publisher: a shared confirm-mode channel, persistent mandatory publishes, and
//! what each confirmation proves.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;
use lapin::options::BasicPublishOptions;
use lapin::publisher_confirm::Confirmation;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Connection};
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

use crate::envelope::HeaderValue;

use super::answers::Answer;
use super::channel::ConfirmChannel;
use super::frame;
use super::Connector;
use crate::config::{AmqpRoute, AmqpRouting};
use crate::sink::window::Window;
use crate::sink::{
    await_confirms, record_outcome, Batch, Confirmed, Confirms, OutMessage, Outcome, PublishError,
};
use crate::wire::{HEADER_ATTEMPT, HEADER_DUE_MS, HEADER_PUBLISH, HEADER_TRIGGER};

/// Where the batch's messages go: the route's exchange and key, the trigger header.
pub(super) struct Target<'a> {
    pub exchange: &'a str,
    /// The route's key, for messages that bring none.
    pub routing_key: &'a str,
    pub trigger: &'a AMQPValue,
}

/// A confirm-mode channel from the sink's pool, bound to one route (workers may share a
/// channel; clones share it too: a worker's batches in flight).
#[derive(Clone)]
pub struct AmqpPublisher {
    pub(super) channel: ConfirmChannel,
    pub(super) conn: Arc<Connection>,
    /// Opens the connections of its own that messages are published alone on, to find the
    /// one the broker refuses.
    pub(super) connector: Arc<Connector>,
    pub(super) route: AmqpRoute,
    /// The sink's window of unconfirmed messages (`max_unconfirmed`), shared by every
    /// publisher on its connection, each trigger in turn.
    pub(super) window: Arc<Window>,
}

impl AmqpPublisher {
    /// False once the channel was closed by the broker or the connection dropped, once a
    /// publish on it was abandoned half-way (its answers are no longer trusted), and while
    /// RabbitMQ blocks the connection (a resource alarm): a worker holding this publisher
    /// then asks the sink for another, which refuses while the alarm lasts, so nothing is
    /// claimed meanwhile.
    pub fn is_usable(&self) -> bool {
        self.channel.usable() && !self.conn.status().blocked()
    }

    /// Closes the channel: RabbitMQ can keep nacking every publish on a channel that was
    /// opened while a quorum queue's leader was moving, long after the queue has a new
    /// leader, where a fresh channel delivers. Publishes still on it fail as on any closed
    /// channel (back to Redis, no attempt counted).
    pub(crate) async fn retire(&self) {
        self.channel
            .close("the broker nacked every message on it")
            .await;
    }

    /// False once the channel was closed by the broker or the connection dropped, whatever
    /// an alarm says: what a closed channel means for the messages on it.
    pub(super) fn channel_open(&self) -> bool {
        self.channel.channel().status().connected()
    }

    /// Publishes the whole batch back to back, a run of the window at a time, then collects
    /// the confirmations (each also to `confirms` as it arrives).
    ///
    /// A run's publishes are polled together: lapin resolves a publish once its I/O thread
    /// wrote the frames, so awaiting each in turn costs a hand-off between threads per
    /// message, while a run shares one.
    pub async fn publish_batch(&mut self, batch: Batch<'_, '_>) -> Vec<Outcome> {
        let mut results = batch.unconfirmed();
        let Batch {
            trigger,
            messages,
            timeout,
            abort,
            confirms,
        } = batch;
        let exchange = self.route.exchange.as_str();
        let routing_key = match &self.route.routing {
            AmqpRouting::Key(key) => key.as_str(),
            // Each message brings its own; none is missing (the worker dead-letters those).
            AmqpRouting::Pointer(_) => "",
        };
        let mut pending = FuturesUnordered::new();
        let mut writing = FuturesUnordered::new();
        let trigger_value = AMQPValue::LongString(trigger.into());
        // The timeout covers writing the batch too: a broker that stops reading fills the
        // socket buffers and the publish itself blocks, past the lease and past shutdown.
        let deadline = tokio::time::Instant::now() + timeout;
        let mut run = Run {
            pending: &mut pending,
            results: &mut results,
            deadline,
            abort,
            confirms,
        };
        // Room in the window, taken a run of messages at a time.
        let mut room: Option<OwnedSemaphorePermit> = None;
        let frame_max = self.conn.configuration().frame_max();
        let channel = &self.channel;
        for (i, m) in messages.iter().enumerate() {
            let number = super::answers::next_publish();
            let props = properties(&trigger_value, m, number);
            if m.properties.is_some() {
                // Only an envelope's headers and properties can grow past a frame.
                if let Some(why) = frame::too_large(&props, frame_max) {
                    run.results[i] = Err(PublishError::FrameTooLarge(why));
                    continue;
                }
            }
            if room.as_ref().is_none_or(|r| r.num_permits() == 0) {
                if let Err(halt) = run.write(&mut writing).await {
                    run.halt(halt, i);
                    break;
                }
                let want = run_len(self.window.size()).min((messages.len() - i) as u32);
                match run.room(&self.window, trigger, want).await {
                    Ok(r) => room = Some(r),
                    Err(halt) => {
                        run.halt(halt, i);
                        break;
                    }
                }
            }
            let Some(permit) = room.as_mut().and_then(|r| r.split(1)) else {
                break;
            };
            // Numbered and queued in the channel's order (see `ConfirmChannel`).
            let publish = channel.publish(
                number,
                exchange,
                m.routing_key.unwrap_or(routing_key),
                MANDATORY,
                m.payload,
                props,
            );
            // Frames are queued on the first poll; one abandoned later may still reach the
            // broker, which makes it a possible duplicate, never a loss.
            writing.push(async move { (i, publish.await, permit) });
        }
        if let Err(halt) = run.write(&mut writing).await {
            run.halt(halt, messages.len());
        }
        drop(writing);
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        await_confirms(&mut results, pending, left, abort, confirms).await;
        if !self.conn.status().blocked() {
            let target = Target {
                exchange,
                routing_key,
                trigger: &trigger_value,
            };
            self.isolate(&target, messages, &mut results, deadline, abort, confirms)
                .await;
        }
        self.unanswered(&mut results);
        results
    }

    /// What a confirmation still owed says once publishing is over: under a resource alarm,
    /// nothing of the messages (back without an attempt); on a closed channel, nothing either
    /// (a refusal closes it for every message on it, and the answer can no longer come).
    fn unanswered(&self, results: &mut [Outcome]) {
        let unanswered = if self.conn.status().blocked() {
            // A resource alarm, not the messages: back without an attempt.
            Some(PublishError::Blocked)
        } else if !self.channel_open() {
            // The channel closed (a refusal closes it for every message on it): a confirmation
            // it still owed can no longer come, which says nothing of the message.
            Some(PublishError::Connection(
                "the channel closed before the broker confirmed".into(),
            ))
        } else {
            None
        };
        if let Some(e) = unanswered {
            for r in results.iter_mut() {
                if matches!(r, Err(PublishError::Timeout)) {
                    *r = Err(e.clone());
                }
            }
        }
    }
}

/// Most room in a window of `max_unconfirmed` a batch takes at once: 64 messages, or a
/// quarter of the window so that four batches can fill it. A run goes out back to back on
/// the channel, and the broker confirms it with a few multiple-acks.
fn run_len(max_unconfirmed: usize) -> u32 {
    max_unconfirmed.div_ceil(4).clamp(1, 64) as u32
}

/// Why a batch stopped publishing before its last message.
enum Halt {
    /// Its time ran out: what was not confirmed stays `Timeout`.
    Deadline,
    /// The worker gave up on it.
    Aborted,
    /// The channel failed a publish: nothing after it went out either.
    Failed(PublishError),
}

/// A message's confirmation still owed, holding its room in the window until it comes.
struct Confirm {
    i: usize,
    confirm: Answer,
    _room: OwnedSemaphorePermit,
}

impl Future for Confirm {
    type Output = (usize, Outcome);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let i = self.i;
        Pin::new(&mut self.confirm)
            .poll(cx)
            .map(|r| (i, confirmation(r)))
    }
}

/// A batch being published: the confirmations it is owed and each message's outcome so far.
struct Run<'r, 'b> {
    pending: &'r mut FuturesUnordered<Confirm>,
    results: &'r mut [Outcome],
    deadline: tokio::time::Instant,
    abort: &'b CancellationToken,
    confirms: Option<&'b Confirms>,
}

impl Run<'_, '_> {
    /// Room for `want` more messages in `window`, recording confirmations meanwhile (this
    /// batch's own free room too).
    async fn room(
        &mut self,
        window: &Window,
        trigger: &str,
        want: u32,
    ) -> Result<OwnedSemaphorePermit, Halt> {
        // Kept across the loop: the trigger's turn is held while this waits.
        let mut got = std::pin::pin!(window.room(trigger, want));
        loop {
            tokio::select! {
                // Never closed: the error cannot happen.
                got = &mut got => return got.ok_or(Halt::Deadline),
                Some((j, r)) = self.pending.next(), if !self.pending.is_empty() => {
                    record_outcome(self.results, j, r, self.confirms);
                }
                _ = tokio::time::sleep_until(self.deadline) => return Err(Halt::Deadline),
                _ = self.abort.cancelled() => return Err(Halt::Aborted),
            }
        }
    }

    /// Waits until lapin wrote every publish of `writing`, whose confirmations are then owed.
    async fn write<W>(&mut self, writing: &mut FuturesUnordered<W>) -> Result<(), Halt>
    where
        W: Future<Output = (usize, lapin::Result<Answer>, OwnedSemaphorePermit)>,
    {
        let mut failed = None;
        while !writing.is_empty() {
            tokio::select! {
                Some((i, sent, room)) = writing.next() => match sent {
                    Ok(confirm) => self.pending.push(Confirm { i, confirm, _room: room }),
                    Err(e) => {
                        // The channel is gone: nothing after this message goes out either.
                        let e = classify(e);
                        self.results[i] = Err(e.clone());
                        failed.get_or_insert(e);
                    }
                },
                Some((j, r)) = self.pending.next(), if !self.pending.is_empty() => {
                    record_outcome(self.results, j, r, self.confirms);
                }
                _ = tokio::time::sleep_until(self.deadline) => return Err(Halt::Deadline),
                _ = self.abort.cancelled() => return Err(Halt::Aborted),
            }
        }
        failed.map_or(Ok(()), |e| Err(Halt::Failed(e)))
    }

    /// Records why the messages from `next` on were not published. Those written and not
    /// yet confirmed keep `Timeout` until their confirmations are awaited.
    fn halt(&mut self, halt: Halt, next: usize) {
        match halt {
            // The rest stay `Timeout`, like unconfirmed messages.
            Halt::Deadline => {}
            Halt::Aborted => self.results[next..].fill(Err(PublishError::Aborted)),
            Halt::Failed(e) => self.results[next..].fill(Err(e)),
        }
    }
}

pub(super) const MANDATORY: BasicPublishOptions = BasicPublishOptions {
    mandatory: true,
    immediate: false,
};

/// Persistent, with the message id, the envelope's headers and properties, and the
/// bridge's headers (which win over an envelope's of the same name), the publish's `number`
/// among them.
pub(super) fn properties(trigger: &AMQPValue, m: &OutMessage<'_>, number: u64) -> BasicProperties {
    let mut headers = FieldTable::default();
    let mut props = BasicProperties::default();
    if let Some(p) = m.properties {
        for (name, value) in &p.headers {
            let value = match value {
                HeaderValue::Text(s) => AMQPValue::LongString(s.as_str().into()),
                HeaderValue::Int(i) => AMQPValue::LongLongInt(*i),
                HeaderValue::Bool(b) => AMQPValue::Boolean(*b),
            };
            headers.insert(ShortString::from(name.as_str()), value);
        }
        let short = |s: &Option<String>| s.as_deref().map(ShortString::from);
        if let Some(v) = short(&p.content_type) {
            props = props.with_content_type(v);
        }
        if let Some(v) = short(&p.content_encoding) {
            props = props.with_content_encoding(v);
        }
        if let Some(v) = short(&p.correlation_id) {
            props = props.with_correlation_id(v);
        }
        if let Some(v) = short(&p.reply_to) {
            props = props.with_reply_to(v);
        }
        if let Some(v) = short(&p.kind) {
            props = props.with_type(v);
        }
        if let Some(v) = p.priority {
            props = props.with_priority(v);
        }
        if let Some(v) = p.expiration_ms {
            props = props.with_expiration(v.to_string().into());
        }
        if let Some(v) = p.timestamp {
            props = props.with_timestamp(v);
        }
        if let Some(v) = short(&p.app_id) {
            props = props.with_app_id(v);
        }
    }
    headers.insert(ShortString::from(HEADER_TRIGGER), trigger.clone());
    headers.insert(
        ShortString::from(HEADER_DUE_MS),
        AMQPValue::LongLongInt(m.due_ms),
    );
    headers.insert(
        ShortString::from(HEADER_ATTEMPT),
        AMQPValue::LongLongInt(m.attempt.into()),
    );
    headers.insert(
        ShortString::from(HEADER_PUBLISH),
        AMQPValue::LongLongInt(i64::try_from(number).unwrap_or(i64::MAX)),
    );
    props
        .with_delivery_mode(2)
        .with_message_id(m.id.into())
        .with_headers(headers)
}

/// What a publisher confirmation proves.
pub(super) fn confirmation(r: Result<Confirmation, lapin::Error>) -> Outcome {
    match r {
        Ok(Confirmation::Ack(None)) => Ok(Confirmed::by_broker()),
        Ok(Confirmation::Ack(Some(ret)) | Confirmation::Nack(Some(ret))) => Err(
            PublishError::Returned(format!("{} {}", ret.reply_code, ret.reply_text)),
        ),
        Ok(Confirmation::Nack(None)) => Err(PublishError::Nack),
        // Only a channel without confirm mode answers this: it proves nothing.
        Ok(Confirmation::NotRequested) => Err(PublishError::Connection(
            "the channel is not in confirm mode".into(),
        )),
        Err(e) => Err(classify(e)),
    }
}

/// A failed publish, confirmation or channel open: the broker closed the channel or the
/// connection (its reply code and text kept: isolation finds out whose fault it was), or the
/// connection was lost. Either way the message goes back untried unless isolation blames it.
pub(super) fn classify(e: lapin::Error) -> PublishError {
    match e {
        lapin::Error::ProtocolError(e) => PublishError::Closed {
            code: e.get_id(),
            text: e.get_message().to_string(),
        },
        e => PublishError::Connection(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_a_quarter_of_the_window_up_to_64() {
        assert_eq!(run_len(256), 64);
        assert_eq!(run_len(1000), 64);
        assert_eq!(run_len(8), 2);
        assert_eq!(run_len(1), 1);
    }
}
