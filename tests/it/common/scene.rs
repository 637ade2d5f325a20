//! What most end-to-end tests start from, in one call.

use super::{redis, unique, AmqpCapture, Conn};

/// A connection to the shared Redis, a capture of what reaches RabbitMQ with `routing_key`,
/// and a fresh queue key `PREFIX-N:{TAG}` (its keys in one hash slot).
pub async fn amqp_scene(routing_key: &str, prefix: &str, tag: &str) -> (Conn, AmqpCapture, String) {
    let r = redis().await;
    let capture = AmqpCapture::start(routing_key).await;
    let key = format!("{}:{{{tag}}}", unique(prefix));
    (r, capture, key)
}
