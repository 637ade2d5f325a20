//! What the benchmark and the integration tests reach of the crate, and nothing more: the
//! configuration's loaders and types, the store and its connection, the sinks' publishers.

/// The configuration: loading, the validated types the bridge runs on.
pub mod config {
    pub use crate::config::{
        load, load_from, Config, Destination, Problem, Redis, RedisConfig, RedisMode, Sink,
        SinkConfig, Tls, Trigger,
    };
}

/// The Redis side: the connection, the checks and the engine read at start, a queue's store.
pub mod redis {
    pub use crate::redis::checks;
    pub use crate::redis::conn;
    pub use crate::redis::engine;
    pub use crate::redis::store;
}

/// The sinks: a publisher of each kind and what it publishes.
pub mod sink {
    pub use crate::sink::{kafka, Batch, MessageId, OutMessage, Publisher, Sink};
}

/// The metrics registry.
pub mod metrics {
    pub use crate::metrics::Metrics;
}

/// Secrets kept out of what is shown.
pub mod secret {
    pub use crate::secret::redact_url;
}

/// Recurring schedules: the tick members the schedule script enqueues.
pub mod schedule {
    pub use crate::schedule::tick;
}

/// The daemon: run until shut down.
pub mod bridge {
    pub use crate::bridge::{run, Shutdown};
}

/// The proof of a sink's confirmation.
pub mod proof {
    pub use crate::proof::Confirmed;
}
