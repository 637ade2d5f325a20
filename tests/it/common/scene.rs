//! What most end-to-end tests start from and end with, each in one call.

use std::time::Duration;

use super::{
    amqp_trigger, base_config, cleanup_keys, free_port, redis, unique, wait_until, AmqpCapture,
    Bridge, Conn,
};

/// A connection to the shared Redis, a capture of what reaches RabbitMQ with `routing_key`,
/// and a fresh queue key `PREFIX-N:{TAG}` (its keys in one hash slot).
pub async fn amqp_scene(routing_key: &str, prefix: &str, tag: &str) -> (Conn, AmqpCapture, String) {
    let r = redis().await;
    let capture = AmqpCapture::start(routing_key).await;
    let key = format!("{}:{{{tag}}}", unique(prefix));
    (r, capture, key)
}

/// A bridge on [`base_config`] with one trigger, `name`, forwarding `key` to `capture` (with
/// `extra` lines in the trigger), ready within `timeout`.
pub async fn ready_amqp_bridge(
    name: &str,
    key: &str,
    capture: &AmqpCapture,
    extra: &str,
    timeout: Duration,
) -> Bridge {
    let port = free_port();
    let config = base_config(port) + &amqp_trigger(name, key, capture, extra);
    Bridge::start(&config, port).ready(timeout).await
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
