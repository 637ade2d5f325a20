//! A confirm-mode channel that several tasks publish on: each publish takes its delivery tag and queues its frames in one step.
//!
//! lapin numbers a publish (the delivery tag its confirmation will carry) and queues its
//! frames in two steps of the publish's first poll. Two tasks publishing on one channel at
//! once can queue their frames in the other order than they were numbered: the broker then
//! numbers them the other way round, and its answer for one resolves the other's
//! confirmation. When the broker refuses the first of the two and closes the channel, the
//! second never reached a queue, yet lapin reports it confirmed. Every publish on a shared
//! channel goes through [`ConfirmChannel::publish`], which holds the channel's lock across
//! that first poll.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use lapin::options::BasicPublishOptions;
use lapin::publisher_confirm::PublisherConfirm;
use lapin::{BasicProperties, Channel};

/// A channel shared by publishers (clones share it and its lock).
#[derive(Clone)]
pub(crate) struct ConfirmChannel {
    channel: Channel,
    /// Held while a publish takes its delivery tag and queues its frames.
    numbering: Arc<Mutex<()>>,
}

impl ConfirmChannel {
    pub(crate) fn new(channel: Channel) -> Self {
        Self {
            channel,
            numbering: Arc::default(),
        }
    }

    pub(crate) fn channel(&self) -> &Channel {
        &self.channel
    }

    /// `basic_publish`, its delivery tag and its frames in the same order as every other
    /// publish on this channel. Frames are queued on the first poll.
    pub(crate) fn publish<'a>(
        &'a self,
        exchange: &'a str,
        routing_key: &'a str,
        options: BasicPublishOptions,
        payload: &'a [u8],
        properties: BasicProperties,
    ) -> Numbered<'a> {
        Numbered {
            numbering: Some(&self.numbering),
            publish: Box::pin(self.channel.basic_publish(
                exchange,
                routing_key,
                options,
                payload,
                properties,
            )),
        }
    }
}

type Publish<'a> = Pin<Box<dyn Future<Output = lapin::Result<PublisherConfirm>> + Send + 'a>>;

/// A publish whose first poll holds its channel's lock (see the module's doc). Boxed:
/// lapin's publish future is large.
pub(crate) struct Numbered<'a> {
    /// The lock, until the first poll.
    numbering: Option<&'a Mutex<()>>,
    publish: Publish<'a>,
}

impl Future for Numbered<'_> {
    type Output = lapin::Result<PublisherConfirm>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.numbering.take() {
            Some(lock) => {
                let _numbering = lock.lock().unwrap_or_else(|e| e.into_inner());
                self.publish.as_mut().poll(cx)
            }
            None => self.publish.as_mut().poll(cx),
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
                .publish("", &queue, BasicPublishOptions::default(), &body, props)
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
        let conn = Connection::connect(&amqp_url(), ConnectionProperties::default())
            .await
            .expect("RabbitMQ must run (see the README)");
        let setup = conn.create_channel().await.unwrap();
        let exclusive = QueueDeclareOptions {
            exclusive: true,
            auto_delete: true,
            ..QueueDeclareOptions::default()
        };
        let takes = setup
            .queue_declare("", exclusive, FieldTable::default())
            .await
            .unwrap()
            .name()
            .to_string();
        let mut refusing = FieldTable::default();
        refusing.insert("x-max-length".into(), AMQPValue::LongLongInt(0));
        refusing.insert(
            "x-overflow".into(),
            AMQPValue::LongString("reject-publish".into()),
        );
        let refuses = setup
            .queue_declare("", exclusive, refusing)
            .await
            .unwrap()
            .name()
            .to_string();
        let channel = conn.create_channel().await.unwrap();
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        let shared = ConfirmChannel::new(channel);
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
}
