//! RabbitMQ sink: persistent, mandatory publishes on confirm-mode channels.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::FuturesUnordered;
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::publisher_confirm::Confirmation;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use tokio_util::sync::CancellationToken;

use super::{await_confirms, OutMessage, PublishError, Route};
use crate::backoff::Backoff;
use crate::config::{AmqpDeclare, AmqpSinkConfig};
use crate::metrics::Metrics;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A RabbitMQ connection shared by the workers; each worker publishes on its own channel.
pub struct AmqpSink {
    name: String,
    url: String,
    declare: Vec<AmqpDeclare>,
    reconnect_max: Duration,
    conn: tokio::sync::Mutex<Option<Arc<Connection>>>,
    up: AtomicBool,
}

impl AmqpSink {
    /// Reads the password file, if any; does not connect yet.
    pub fn new(name: &str, config: &AmqpSinkConfig) -> anyhow::Result<Self> {
        let mut url = url::Url::parse(&config.url)?;
        if let Some(file) = &config.password_file {
            let password = crate::secret::read_file(file)?;
            url.set_password(Some(&password))
                .map_err(|_| anyhow::anyhow!("sinks.{name}.url cannot carry a password"))?;
        }
        Ok(Self {
            name: name.to_string(),
            url: with_heartbeat(url).to_string(),
            declare: config.declare.clone(),
            reconnect_max: config.reconnect_max,
            conn: tokio::sync::Mutex::new(None),
            up: AtomicBool::new(false),
        })
    }

    /// The sink's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// True while the connection is open.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// Forgets the connection if a worker found it unusable; the next call reconnects.
    pub async fn reset(&self) {
        let mut guard = self.conn.lock().await;
        if let Some(conn) = guard.take() {
            self.up.store(false, Ordering::Relaxed);
            let _ =
                tokio::time::timeout(Duration::from_secs(1), conn.close(320, "reconnecting")).await;
        }
    }

    /// The open connection, connecting (and declaring the topology) if there is none.
    async fn connection(&self) -> Result<Arc<Connection>, PublishError> {
        let mut guard = self.conn.lock().await;
        if let Some(conn) = guard.as_ref() {
            if conn.status().connected() {
                return Ok(conn.clone());
            }
            self.up.store(false, Ordering::Relaxed);
        }
        let props = ConnectionProperties::default()
            .with_executor(tokio_executor_trait::Tokio::current())
            .with_reactor(tokio_reactor_trait::Tokio)
            .with_connection_name(format!("delay-bridge/{}", self.name).into());
        let conn = tokio::time::timeout(CONNECT_TIMEOUT, Connection::connect(&self.url, props))
            .await
            .map_err(|_| PublishError::Connection("connect timed out".into()))?
            .map_err(|e| PublishError::Connection(e.to_string()))?;
        declare(&conn, &self.declare)
            .await
            .map_err(|e| PublishError::Connection(format!("declaring topology: {e}")))?;
        let conn = Arc::new(conn);
        *guard = Some(conn.clone());
        self.up.store(true, Ordering::Relaxed);
        Ok(conn)
    }

    /// Connects at start and reconnects with capped backoff whenever the connection drops,
    /// so readiness recovers even when no worker is publishing.
    pub async fn supervise(&self, metrics: Metrics, cancel: CancellationToken) {
        let gauge = metrics.sink_up.with_label_values(&[&self.name]);
        let backoff = Backoff {
            initial: Duration::from_millis(100),
            max: self.reconnect_max,
        };
        let mut failures = 0u32;
        loop {
            let wait = match self.connection().await {
                Ok(_) => {
                    if failures > 0 {
                        tracing::info!(sink = %self.name, "connected to RabbitMQ");
                    }
                    failures = 0;
                    gauge.set(1);
                    Duration::from_millis(250)
                }
                Err(e) => {
                    gauge.set(0);
                    failures += 1;
                    if failures == 1 || failures.is_power_of_two() {
                        tracing::warn!(sink = %self.name, error = %e, failures, "RabbitMQ unreachable, retrying");
                    }
                    backoff.delay(failures)
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = cancel.cancelled() => return,
            }
        }
    }

    /// Opens a confirm-mode channel for one worker, after checking (passively) that the
    /// exchange it will publish to exists: a missing exchange is an operator's fix, so the
    /// worker does not claim (messages wait in Redis) rather than fail every message.
    pub async fn publisher(&self, exchange: &str) -> Result<AmqpPublisher, PublishError> {
        let conn = self.connection().await?;
        let open = async {
            if !exchange.is_empty() {
                let probe = conn.create_channel().await?;
                let passive = ExchangeDeclareOptions {
                    passive: true,
                    ..Default::default()
                };
                let kind = ExchangeKind::Direct;
                match probe
                    .exchange_declare(exchange, kind, passive, FieldTable::default())
                    .await
                {
                    Ok(()) => {
                        let _ = probe.close(200, "checked").await;
                    }
                    Err(lapin::Error::ProtocolError(e)) if e.get_id() == 404 => {
                        return Ok(Err(PublishError::NoExchange(exchange.to_string())));
                    }
                    Err(e) => return Err(e),
                }
            }
            let channel = conn.create_channel().await?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await?;
            Ok::<_, lapin::Error>(Ok(channel))
        };
        let err = match tokio::time::timeout(CONNECT_TIMEOUT, open).await {
            Ok(Ok(Ok(channel))) => return Ok(AmqpPublisher { channel }),
            Ok(Ok(Err(missing))) => return Err(missing),
            Ok(Err(e)) => PublishError::Connection(e.to_string()),
            Err(_) => PublishError::Connection("opening a channel timed out".into()),
        };
        // A connection that cannot open a channel is as good as dead: drop it so the next
        // attempt reconnects, and report the sink down meanwhile.
        let mut guard = self.conn.lock().await;
        if guard.as_ref().is_some_and(|c| Arc::ptr_eq(c, &conn)) {
            *guard = None;
            self.up.store(false, Ordering::Relaxed);
        }
        Err(err)
    }
}

/// A failed confirmation means the channel or connection is gone (the broker closes the
/// channel on errors such as a deleted exchange): the message goes back untried.
fn classify(e: lapin::Error) -> PublishError {
    PublishError::Connection(e.to_string())
}

/// Adds a 10 s heartbeat unless the URL sets one, so a silently dead connection is noticed
/// in seconds rather than the broker's default minute.
fn with_heartbeat(mut url: url::Url) -> url::Url {
    if !url.query_pairs().any(|(k, _)| k == "heartbeat") {
        url.query_pairs_mut().append_pair("heartbeat", "10");
    }
    url
}

async fn declare(conn: &Connection, declare: &[AmqpDeclare]) -> Result<(), lapin::Error> {
    if declare.is_empty() {
        return Ok(());
    }
    let channel = conn.create_channel().await?;
    for d in declare {
        let kind = match d.kind.as_str() {
            "topic" => ExchangeKind::Topic,
            "fanout" => ExchangeKind::Fanout,
            "headers" => ExchangeKind::Headers,
            _ => ExchangeKind::Direct,
        };
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        };
        channel
            .exchange_declare(&d.exchange, kind, durable, FieldTable::default())
            .await?;
        if let Some(queue) = &d.queue {
            let opts = QueueDeclareOptions {
                durable: true,
                ..Default::default()
            };
            channel
                .queue_declare(queue, opts, FieldTable::default())
                .await?;
            let binding = d.binding_key.as_deref().unwrap_or(queue);
            channel
                .queue_bind(
                    queue,
                    &d.exchange,
                    binding,
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await?;
        }
    }
    channel.close(200, "declared").await?;
    Ok(())
}

/// A confirm-mode channel of one worker (clones share it: its batches in flight).
#[derive(Clone)]
pub struct AmqpPublisher {
    channel: Channel,
}

impl AmqpPublisher {
    /// False once the channel was closed by the broker or the connection dropped.
    pub fn is_usable(&self) -> bool {
        self.channel.status().connected()
    }

    /// Publishes the whole batch back to back, then collects the confirmations.
    pub async fn publish_batch(
        &mut self,
        trigger: &str,
        route: &Route,
        messages: &[OutMessage<'_>],
        timeout: Duration,
        abort: &CancellationToken,
    ) -> Vec<Result<(), PublishError>> {
        let mut results: Vec<Result<(), PublishError>> =
            vec![Err(PublishError::Timeout); messages.len()];
        let Route::Amqp {
            exchange,
            routing_key,
        } = route
        else {
            results.fill(Err(PublishError::BadPayload(
                "route is not an AMQP route".into(),
            )));
            return results;
        };
        let pending = FuturesUnordered::new();
        let trigger_value = AMQPValue::LongString(trigger.into());
        let options = BasicPublishOptions {
            mandatory: true,
            ..Default::default()
        };
        // The timeout covers writing the batch too: a broker that stops reading fills the
        // socket buffers and the publish itself blocks, past the lease and past shutdown.
        let deadline = tokio::time::Instant::now() + timeout;
        for (i, m) in messages.iter().enumerate() {
            let mut headers = FieldTable::default();
            headers.insert(ShortString::from("x-delay-trigger"), trigger_value.clone());
            headers.insert(
                ShortString::from("x-delay-due-ms"),
                AMQPValue::LongLongInt(m.due_ms),
            );
            headers.insert(
                ShortString::from("x-delay-attempt"),
                AMQPValue::LongLongInt(m.attempt.into()),
            );
            let props = BasicProperties::default()
                .with_delivery_mode(2)
                .with_message_id(m.id.into())
                .with_headers(headers);
            let publish = self.channel.basic_publish(
                exchange,
                m.routing_key.unwrap_or(routing_key),
                options,
                m.payload,
                props,
            );
            // Frames are queued on the first poll; one abandoned here may still reach the
            // broker later, which makes it a possible duplicate, never a loss.
            let sent = tokio::select! {
                sent = publish => sent,
                // The rest stay `Timeout`, like unconfirmed messages.
                _ = tokio::time::sleep_until(deadline) => break,
                _ = abort.cancelled() => {
                    results[i..].fill(Err(PublishError::Aborted));
                    break;
                }
            };
            match sent {
                Ok(confirm) => pending.push(async move {
                    let r =
                        match confirm.await {
                            Ok(Confirmation::Ack(None)) | Ok(Confirmation::NotRequested) => Ok(()),
                            Ok(Confirmation::Ack(Some(ret)))
                            | Ok(Confirmation::Nack(Some(ret))) => Err(PublishError::Returned(
                                format!("{} {}", ret.reply_code, ret.reply_text),
                            )),
                            Ok(Confirmation::Nack(None)) => Err(PublishError::Nack),
                            Err(e) => Err(PublishError::Connection(e.to_string())),
                        };
                    (i, r)
                }),
                Err(e) => {
                    // The channel is gone: nothing after this message was sent either.
                    let err = classify(e);
                    for r in &mut results[i..] {
                        *r = Err(err.clone());
                    }
                    break;
                }
            }
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        await_confirms(&mut results, pending, left, abort).await;
        results
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_heartbeat_is_added_unless_set() {
        let u = with_heartbeat(url::Url::parse("amqp://g:p@h:5672/%2f").unwrap());
        assert_eq!(u.as_str(), "amqp://g:p@h:5672/%2f?heartbeat=10");
        let u = with_heartbeat(url::Url::parse("amqp://h/%2f?heartbeat=3").unwrap());
        assert_eq!(u.as_str(), "amqp://h/%2f?heartbeat=3");
    }
}
