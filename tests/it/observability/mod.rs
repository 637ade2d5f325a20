//! Metrics, health endpoints, logs and `stats` of the real binary against real Redis and RabbitMQ.

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::proxy::Proxy;
use common::*;
use delay_bridge::keys::QueueKeys;

mod backlog;
mod logs;
mod metrics;

const ALLOWED_LABELS: [&str; 8] = [
    "trigger", "sink", "reason", "state", "kind", "version", "revision", "le",
];
