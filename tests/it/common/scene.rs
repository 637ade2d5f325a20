//! What most end-to-end tests start from and end with, each in one call.

use std::time::Duration;

use super::servers::RedisServer;
use super::{
    amqp_trigger, base_config, cleanup_keys, free_port, redis, schedule_now, unique, wait_until,
    AmqpCapture, Bridge, Conn,
};

/// A connection to the shared Redis, a capture of what reaches RabbitMQ with `routing_key`,
/// and a fresh queue key `PREFIX-N:{TAG}` (its keys in one hash slot).
pub async fn amqp_scene(routing_key: &str, prefix: &str, tag: &str) -> (Conn, AmqpCapture, String) {
    let r = redis().await;
    let capture = AmqpCapture::start(routing_key).await;
    let key = format!("{}:{{{tag}}}", unique(prefix));
    (r, capture, key)
}

/// As [`amqp_scene`] on a private Redis, `server`, with the key `delay-N:{TAG}`.
pub async fn amqp_scene_on(
    server: &RedisServer,
    routing_key: &str,
    tag: &str,
) -> (Conn, AmqpCapture, String) {
    let r = server.conn().await;
    let capture = AmqpCapture::start(routing_key).await;
    let key = format!("{}:{{{tag}}}", unique("delay"));
    (r, capture, key)
}

/// A bridge started on [`base_config`] with one trigger, `name`, forwarding `key` to
/// `capture` (with `extra` lines in the trigger).
pub fn amqp_bridge(name: &str, key: &str, capture: &AmqpCapture, extra: &str) -> Bridge {
    let port = free_port();
    let config = base_config(port) + &amqp_trigger(name, key, capture, extra);
    Bridge::start(&config, port)
}

/// An [`amqp_bridge`] ready within `timeout`.
pub async fn ready_amqp_bridge(
    name: &str,
    key: &str,
    capture: &AmqpCapture,
    extra: &str,
    timeout: Duration,
) -> Bridge {
    amqp_bridge(name, key, capture, extra).ready(timeout).await
}

/// Schedules `one`, `two` and `three` due now on `key` and asserts that `bridge` forwards
/// the three to `capture` within 10 s.
pub async fn expect_three_forwarded(
    bridge: &Bridge,
    r: &mut Conn,
    key: &str,
    capture: &AmqpCapture,
) {
    schedule_now(r, key, ["one", "two", "three"]).await;
    bridge
        .expect_arrivals(3, Duration::from_secs(10), || capture.count())
        .await;
}

/// The end of most end-to-end tests: no panic in the bridge's log, the bridge stopped, and
/// the queue's keys removed.
pub async fn finish(bridge: Bridge, r: &mut Conn, key: &str) {
    bridge.assert_no_panic();
    drop(bridge);
    cleanup_keys(r, key).await;
}

/// The bridge stopped, and the queue's keys removed.
pub async fn stop_and_clean(bridge: Bridge, r: &mut Conn, key: &str) {
    drop(bridge);
    cleanup_keys(r, key).await;
}

/// Whether a line of the bridge's log holds `text` within `timeout`.
pub async fn wait_logged(bridge: &Bridge, timeout: Duration, text: &str) -> bool {
    wait_until(timeout, || bridge.log().contains(text)).await
}
