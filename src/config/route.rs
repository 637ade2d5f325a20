//! A trigger's destination, resolved once at load against the type of its sink.

use serde::Serialize;

use super::{KafkaKey, SinkConfig, TriggerConfig};

/// Where a trigger's messages go; a publisher is built with it, so a route can only ever
/// meet a sink of its own kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Destination {
    /// An AMQP exchange.
    Amqp(AmqpRoute),
    /// A Kafka topic.
    Kafka(KafkaRoute),
}

/// An exchange and how each message's routing key is chosen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AmqpRoute {
    /// Exchange name, `""` for the default exchange.
    pub exchange: String,
    /// The routing key.
    pub routing: AmqpRouting,
    /// Topic patterns a message's own routing key must match (`None`: any).
    pub allowed_routing_keys: Option<Vec<String>>,
}

impl AmqpRoute {
    /// Whether a message may be published with its own routing key `key`.
    pub fn allows(&self, key: &str) -> bool {
        self.allowed_routing_keys.as_ref().is_none_or(|patterns| {
            patterns
                .iter()
                .any(|p| crate::envelope::topic_match(p, key))
        })
    }
}

/// How an AMQP message's routing key is chosen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum AmqpRouting {
    /// The same key for every message.
    Key(String),
    /// The string at this JSON Pointer in each payload.
    Pointer(String),
}

/// A topic and what each record's key is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KafkaRoute {
    /// Topic name.
    pub topic: String,
    /// Record key.
    pub key: KafkaKey,
}

impl std::fmt::Display for Destination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Destination::Amqp(r) => match &r.routing {
                AmqpRouting::Key(k) => write!(f, "exchange={:?} routing_key={k:?}", r.exchange),
                AmqpRouting::Pointer(p) => {
                    write!(f, "exchange={:?} routing_key_pointer={p:?}", r.exchange)
                }
            },
            Destination::Kafka(r) => {
                let key = match r.key {
                    KafkaKey::None => "none",
                    KafkaKey::Member => "member",
                };
                write!(f, "topic={:?} kafka_key={key}", r.topic)
            }
        }
    }
}

/// The destination of `t` on `sink`, or the trigger fields that do not fit the sink's
/// type, as (field, problem) pairs.
pub(super) fn resolve(
    t: &TriggerConfig,
    sink: &SinkConfig,
) -> Result<Destination, Vec<(&'static str, String)>> {
    let mut problems = Vec::new();
    let mut foreign = |field: &'static str, set: bool, own: &str, other: &str| {
        if set {
            problems.push((
                field,
                format!("only for {other} sinks; this trigger's sink is {own}"),
            ));
        }
    };
    let destination = match sink {
        SinkConfig::Amqp(_) => {
            foreign("topic", t.topic.is_some(), "amqp", "kafka");
            foreign("kafka_key", t.kafka_key.is_some(), "amqp", "kafka");
            let routing = match (&t.routing_key_pointer, &t.routing_key) {
                (Some(p), _) => AmqpRouting::Pointer(p.clone()),
                (None, k) => AmqpRouting::Key(k.clone().unwrap_or_default()),
            };
            if let Some(patterns) = &t.allowed_routing_keys {
                if patterns.is_empty() {
                    problems.push((
                        "allowed_routing_keys",
                        "an empty list allows nothing: remove it to allow any routing key".into(),
                    ));
                }
                if patterns.iter().any(|p| p.is_empty() || p.len() > 255) {
                    problems.push((
                        "allowed_routing_keys",
                        "patterns must be 1 to 255 bytes".into(),
                    ));
                }
            }
            match &t.exchange {
                Some(exchange) => Some(Destination::Amqp(AmqpRoute {
                    exchange: exchange.clone(),
                    routing,
                    allowed_routing_keys: t.allowed_routing_keys.clone(),
                })),
                None => {
                    problems.push((
                        "exchange",
                        "required for an amqp sink (use \"\" for the default exchange)".into(),
                    ));
                    None
                }
            }
        }
        SinkConfig::Kafka(_) => {
            foreign("exchange", t.exchange.is_some(), "kafka", "amqp");
            foreign("routing_key", t.routing_key.is_some(), "kafka", "amqp");
            foreign(
                "routing_key_pointer",
                t.routing_key_pointer.is_some(),
                "kafka",
                "amqp",
            );
            foreign(
                "allowed_routing_keys",
                t.allowed_routing_keys.is_some(),
                "kafka",
                "amqp",
            );
            match &t.topic {
                None => {
                    problems.push(("topic", "required for a kafka sink".into()));
                    None
                }
                Some(topic) if topic.is_empty() => {
                    problems.push(("topic", "must not be empty".into()));
                    None
                }
                Some(topic) => Some(Destination::Kafka(KafkaRoute {
                    topic: topic.clone(),
                    key: t.kafka_key.unwrap_or_default(),
                })),
            }
        }
    };
    match destination {
        Some(d) if problems.is_empty() => Ok(d),
        _ => Err(problems),
    }
}

/// Where `t` forwards its dead letters on `sink` (`None`: they stay in Redis), or the
/// fields that do not fit, as (field, problem) pairs.
pub(super) fn resolve_dead_letter(
    t: &TriggerConfig,
    sink: &SinkConfig,
) -> Result<Option<Destination>, Vec<(&'static str, String)>> {
    let mut problems = Vec::new();
    let destination = match sink {
        SinkConfig::Amqp(_) => {
            if t.dead_letter_topic.is_some() {
                problems.push((
                    "dead_letter_topic",
                    "only for kafka sinks; use dead_letter_exchange on an amqp sink".into(),
                ));
            }
            match (&t.dead_letter_exchange, &t.dead_letter_routing_key) {
                (Some(exchange), key) => Some(Destination::Amqp(AmqpRoute {
                    exchange: exchange.clone(),
                    routing: AmqpRouting::Key(key.clone().unwrap_or_default()),
                    allowed_routing_keys: None,
                })),
                (None, Some(_)) => {
                    problems.push((
                        "dead_letter_routing_key",
                        "needs dead_letter_exchange (use \"\" for the default exchange)".into(),
                    ));
                    None
                }
                (None, None) => None,
            }
        }
        SinkConfig::Kafka(_) => {
            for (field, set) in [
                ("dead_letter_exchange", t.dead_letter_exchange.is_some()),
                (
                    "dead_letter_routing_key",
                    t.dead_letter_routing_key.is_some(),
                ),
            ] {
                if set {
                    problems.push((
                        field,
                        "only for amqp sinks; use dead_letter_topic on a kafka sink".into(),
                    ));
                }
            }
            match &t.dead_letter_topic {
                Some(topic) if topic.is_empty() => {
                    problems.push(("dead_letter_topic", "must not be empty".into()));
                    None
                }
                Some(topic) => Some(Destination::Kafka(KafkaRoute {
                    topic: topic.clone(),
                    key: t.kafka_key.unwrap_or_default(),
                })),
                None => None,
            }
        }
    };
    if problems.is_empty() {
        Ok(destination)
    } else {
        Err(problems)
    }
}
