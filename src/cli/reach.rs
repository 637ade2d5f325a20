//! How a command reaches a trigger's queue: the configured Redis, connected, and the trigger
//! named on the command line.

use std::sync::Arc;

use anyhow::Context;

use crate::config::{Config, Trigger};
use crate::redis::conn::{Conn, Endpoint};
use crate::redis::queue::Queue;

/// A connection to the configured Redis, or an error that says where it is.
pub(super) async fn connect(config: &Config) -> anyhow::Result<Conn> {
    let endpoint = Arc::new(Endpoint::new(&config.redis)?);
    endpoint.connect().await.map_err(|e| {
        // The client's error names the address already, most of the time.
        let text = e.to_string();
        let shown = endpoint.to_string();
        if text.contains(&shown) {
            anyhow::anyhow!("cannot reach Redis: {text}")
        } else {
            anyhow::anyhow!("cannot reach Redis at {shown}: {text}")
        }
    })
}

/// The trigger named `name` in `config`.
pub(super) fn trigger<'a>(config: &'a Config, name: &str) -> anyhow::Result<&'a Trigger> {
    config
        .triggers
        .iter()
        .find(|t| t.name() == name)
        .with_context(|| format!("no trigger named `{name}`"))
}

/// The queue of the trigger named `trigger`, on `conn`.
pub(super) fn queue_for(config: &Config, conn: Conn, trigger: &str) -> anyhow::Result<Queue> {
    Queue::new(self::trigger(config, trigger)?, conn)
}
