//! A confirm-mode channel that several tasks publish on: each publish takes its delivery tag and queues its frames in one step, and gets the broker's answer for its own message.
//!
//! lapin numbers a publish (the delivery tag its confirmation will carry) and queues its
//! frames in two steps of the publish's first poll. Two tasks publishing on one channel at
//! once can queue their frames in the other order than they were numbered: the broker then
//! numbers them the other way round, and its answer for one resolves the other's
//! confirmation. When the broker refuses the first of the two and closes the channel, the
//! second never reached a queue, yet lapin reports it confirmed. Every publish on a shared
//! channel goes through [`ConfirmChannel::publish`], which holds the channel's lock across
//! that first poll, and hands the publish to the channel's collector in the same step (see
//! [`answers`](super::answers) for what the collector fixes in lapin's answers).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use lapin::options::BasicPublishOptions;
use lapin::publisher_confirm::PublisherConfirm;
use lapin::{BasicProperties, Channel};
use tokio::sync::{mpsc, oneshot, Notify};

use super::answers::{self, Answer, Answered, Entry};

/// A channel shared by publishers (clones share it, its lock and its collector).
#[derive(Clone)]
pub(crate) struct ConfirmChannel {
    channel: Channel,
    shared: Arc<Shared>,
}

struct Shared {
    /// Held while a publish takes its delivery tag, queues its frames and goes to the
    /// collector.
    numbering: Mutex<mpsc::UnboundedSender<Entry>>,
    /// Wakes the collector when a publish's frames were written (or it was abandoned).
    written: Arc<Notify>,
    /// A publish was abandoned before its frames were written: the collector can no longer
    /// tell a confirmed message from a returned one, and the channel is retired.
    doubtful: AtomicBool,
}

impl ConfirmChannel {
    /// Wraps a channel in confirm mode and starts its collector.
    pub(crate) fn new(channel: Channel) -> Self {
        let (entries, collected) = mpsc::unbounded_channel();
        let written = Arc::new(Notify::new());
        tokio::spawn(answers::collect(
            collected,
            written.clone(),
            channel.clone(),
        ));
        Self {
            channel,
            shared: Arc::new(Shared {
                numbering: Mutex::new(entries),
                written,
                doubtful: AtomicBool::new(false),
            }),
        }
    }

    pub(crate) fn channel(&self) -> &Channel {
        &self.channel
    }

    /// Closes the channel with `reason` (waiting a second at most for the broker's answer):
    /// it is no longer [`Self::usable`], so the pool opens another in its place.
    pub(crate) async fn close(&self, reason: &str) {
        let closing = self.channel.close(200, reason);
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), closing).await;
    }

    /// Open, and no publish on it was abandoned half-way (see [`Shared`]): a publisher may
    /// still be given it.
    pub(crate) fn usable(&self) -> bool {
        self.channel.status().connected() && !self.shared.doubtful.load(Ordering::Relaxed)
    }

    /// `basic_publish` of publish number `number` (the `x-delay-publish` header of
    /// `properties`, see [`answers::next_publish`]), its delivery tag and its frames in the
    /// same order as every other publish on this channel. Frames are queued on the first poll;
    /// the result, once they are written, is the broker's answer to come.
    pub(crate) fn publish<'a>(
        &'a self,
        number: u64,
        exchange: &'a str,
        routing_key: &'a str,
        options: BasicPublishOptions,
        payload: &'a [u8],
        properties: BasicProperties,
    ) -> Numbered<'a> {
        Numbered {
            shared: &self.shared,
            id: number,
            first: true,
            publish: Box::pin(self.channel.basic_publish(
                exchange,
                routing_key,
                options,
                payload,
                properties,
            )),
            written: None,
            answer: None,
        }
    }
}

type Publish<'a> = Pin<Box<dyn Future<Output = lapin::Result<PublisherConfirm>> + Send + 'a>>;

/// A publish whose first poll holds its channel's lock (see the module's doc). Boxed:
/// lapin's publish future is large.
pub(crate) struct Numbered<'a> {
    shared: &'a Shared,
    /// The publish number.
    id: u64,
    first: bool,
    publish: Publish<'a>,
    /// Hands the confirmation to the collector once the frames are written.
    written: Option<oneshot::Sender<Option<PublisherConfirm>>>,
    answer: Option<oneshot::Receiver<Answered>>,
}

impl Numbered<'_> {
    fn written(&mut self, confirm: PublisherConfirm) -> Answer {
        if let Some(tx) = self.written.take() {
            let _ = tx.send(Some(confirm));
            self.shared.written.notify_one();
        }
        let (_, closed) = oneshot::channel();
        Answer(self.answer.take().unwrap_or(closed))
    }
}

impl Future for Numbered<'_> {
    type Output = lapin::Result<Answer>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let polled = if this.first {
            this.first = false;
            let order = this
                .shared
                .numbering
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            // Handed to the collector before its frames can go out, so that the collector
            // knows of it before the broker can answer it.
            let (written, written_rx) = oneshot::channel();
            let (answer_tx, answer) = oneshot::channel();
            let entry = Entry {
                id: this.id,
                written: written_rx,
                answer: answer_tx,
            };
            let _ = order.send(entry);
            let polled = this.publish.as_mut().poll(cx);
            if let Poll::Ready(Err(e)) = polled {
                // Refused before it was numbered (the channel or the connection is gone).
                let _ = written.send(None);
                this.shared.written.notify_one();
                return Poll::Ready(Err(e));
            }
            drop(order);
            this.written = Some(written);
            this.answer = Some(answer);
            polled
        } else {
            this.publish.as_mut().poll(cx)
        };
        match polled {
            Poll::Ready(Ok(confirm)) => Poll::Ready(Ok(this.written(confirm))),
            Poll::Ready(Err(e)) => {
                // Numbered, never written: the connection is gone (see `Drop`).
                Poll::Ready(Err(e))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for Numbered<'_> {
    fn drop(&mut self) {
        if self.written.take().is_some() {
            self.shared.doubtful.store(true, Ordering::Relaxed);
            self.shared.written.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use lapin::options::{ConfirmSelectOptions, QueueDeclareOptions};
    use lapin::publisher_confirm::Confirmation;
    use lapin::types::{AMQPValue, FieldTable};
    use lapin::{Connection, ConnectionProperties};

    use super::*;

    /// The broker's own RabbitMQ for tests (`DELAY_BRIDGE_TEST_AMQP`).
    fn amqp_url() -> String {
        std::env::var("DELAY_BRIDGE_TEST_AMQP")
            .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
    }

    /// A connection, a shared channel in confirm mode on it, and one exclusive queue per
    /// entry of `queues` (declared with those arguments), by name.
    async fn scene(queues: Vec<FieldTable>) -> (Connection, ConfirmChannel, Vec<String>) {
        let conn = Connection::connect(&amqp_url(), ConnectionProperties::default())
            .await
            .expect("RabbitMQ must run (see the README)");
        let setup = conn.create_channel().await.unwrap();
        let exclusive = QueueDeclareOptions {
            exclusive: true,
            auto_delete: true,
            ..QueueDeclareOptions::default()
        };
        let mut names = Vec::new();
        for args in queues {
            let q = setup.queue_declare("", exclusive, args).await.unwrap();
            names.push(q.name().to_string());
        }
        let channel = conn.create_channel().await.unwrap();
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        (conn, ConfirmChannel::new(channel), names)
    }

    /// Publishes `n` messages of `size` bytes to `queue` through `channel`, each as soon as
    /// the last one was written, and returns how the broker answered each.
    async fn publish_all(
        channel: ConfirmChannel,
        queue: String,
        n: usize,
        size: usize,
    ) -> Vec<Confirmation> {
        let body = vec![b'x'; size];
        let mut confirms = Vec::with_capacity(n);
        for _ in 0..n {
            let props = BasicProperties::default();
            let confirm = channel
                .publish(
                    answers::next_publish(),
                    "",
                    &queue,
                    BasicPublishOptions::default(),
                    &body,
                    props,
                )
                .await
                .expect("published");
            confirms.push(confirm);
        }
        let mut answers = Vec::with_capacity(n);
        for c in confirms {
            answers.push(c.await.expect("answered"));
        }
        answers
    }

    /// Two tasks publish at once on one channel, one to a queue that takes everything, the
    /// other to a queue that refuses everything (`x-max-length` 0, `reject-publish`): every
    /// answer must be the one the broker gave that very message. Numbered apart from their
    /// frames, the two tasks' publishes reach the broker in another order than their delivery
    /// tags, and acks and nacks land on the wrong messages.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_publish_gets_the_brokers_answer_for_itself() {
        let mut refusing = FieldTable::default();
        refusing.insert("x-max-length".into(), AMQPValue::LongLongInt(0));
        refusing.insert(
            "x-overflow".into(),
            AMQPValue::LongString("reject-publish".into()),
        );
        let (conn, shared, queues) = scene(vec![FieldTable::default(), refusing]).await;
        let [takes, refuses] = <[String; 2]>::try_from(queues).unwrap();
        // Large bodies take long to frame, small ones slip in meanwhile.
        let taken = tokio::spawn(publish_all(shared.clone(), takes, 300, 256 * 1024));
        let refused = tokio::spawn(publish_all(shared, refuses, 6000, 16));
        let (taken, refused) = (taken.await.unwrap(), refused.await.unwrap());
        let nacked = taken
            .iter()
            .filter(|c| !matches!(c, Confirmation::Ack(None)))
            .count();
        let acked = refused
            .iter()
            .filter(|c| !matches!(c, Confirmation::Nack(None)))
            .count();
        assert_eq!(
            (nacked, acked),
            (0, 0),
            "messages the broker took reported refused, and refused ones reported taken"
        );
        let _ = conn.close(200, "done").await;
    }

    /// Mandatory publishes, every other one routed nowhere, confirmed by the broker many at a
    /// time, all with the same message id: each returned message comes back with its own
    /// publish's answer (lapin alone hands it to any of the confirmations of a multiple-ack),
    /// matched by the publish's number, not by the id a producer chose.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_returned_message_comes_back_to_its_own_publish() {
        let (conn, shared, queues) = scene(vec![FieldTable::default()]).await;
        let takes = &queues[0];
        let nowhere = format!("nowhere-{takes}");
        let mandatory = BasicPublishOptions {
            mandatory: true,
            immediate: false,
        };
        let mut answers = Vec::new();
        for i in 0..4000usize {
            let key = if i % 2 == 0 { takes } else { &nowhere };
            let id = i.to_string();
            let number = answers::next_publish();
            let mut headers = FieldTable::default();
            headers.insert(
                crate::wire::HEADER_PUBLISH.into(),
                AMQPValue::LongLongInt(number as i64),
            );
            let props = BasicProperties::default()
                .with_message_id("the-same-id".into())
                .with_headers(headers);
            let answer = shared
                .publish(number, "", key, mandatory, id.as_bytes(), props)
                .await
                .expect("published");
            answers.push((i, answer));
        }
        let mut wrong = Vec::new();
        for (i, answer) in answers {
            let got = answer.await.expect("answered");
            let right = match (&got, i % 2) {
                (Confirmation::Ack(None), 0) => true,
                (Confirmation::Ack(Some(r)), 1) => r.delivery.data == i.to_string().into_bytes(),
                _ => false,
            };
            if !right {
                wrong.push(i);
            }
        }
        assert!(wrong.is_empty(), "{} wrong answers: {wrong:?}", wrong.len());
        let _ = conn.close(200, "done").await;
    }
}
