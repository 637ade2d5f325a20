//! `[triggers.ingress]`: producers hand the bridge delayed messages through the broker (an AMQP exchange and queue, or a Kafka topic, it consumes with `x-delay`), and the checks of that table.

use serde::{Deserialize, Serialize};

use super::{ExchangeType, MessageFormat, PayloadMode, QueueType, SinkConfig, TriggerConfig};

/// Most deliveries the ingress holds unacknowledged at once (`prefetch`): AMQP's limit.
pub(crate) const MAX_PREFETCH: u16 = u16::MAX;

/// `[triggers.ingress]`: on an AMQP trigger the exchange producers publish to with an
/// `x-delay` header and the queue the bridge consumes it through; on a Kafka trigger the
/// topic producers write such records to.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct IngressConfig {
    /// AMQP: the exchange producers publish delayed messages to (declared durable by the
    /// bridge). Required on an AMQP trigger.
    pub exchange: Option<String>,
    /// Its type: `fanout` (default), `topic` or `headers` (every message is taken; a `direct`
    /// exchange routes only exact keys). An exchange that already exists with another type
    /// (the delayed-message plugin's) is used as it is.
    #[serde(default = "default_exchange_type")]
    pub exchange_type: ExchangeType,
    /// The durable queue the bridge consumes, bound to `exchange`. Default: `<exchange>.ingress`.
    pub queue: Option<String>,
    /// The queue's type (`x-queue-type`): `classic` (default) or `quorum`.
    pub queue_type: Option<QueueType>,
    /// The keys the queue is bound with (default `["#"]`: every key of a `topic` exchange;
    /// a `fanout` or `headers` exchange ignores them). An exchange of the delayed-message
    /// plugin with `x-delayed-type = direct` needs the routing keys producers use.
    #[serde(default = "default_binding_keys")]
    pub binding_keys: Vec<String>,
    /// Most deliveries held unacknowledged at once (AMQP `basic.qos`), 1 to 65535.
    #[serde(default = "default_prefetch")]
    pub prefetch: u16,
    /// Kafka: the topic producers write delayed records to. Required on a Kafka trigger.
    pub topic: Option<String>,
    /// Kafka: the consumer group the bridge reads `topic` in. Default:
    /// `delay-bridge.<trigger name>`.
    pub group: Option<String>,
}

fn default_exchange_type() -> ExchangeType {
    ExchangeType::Fanout
}
fn default_binding_keys() -> Vec<String> {
    vec!["#".into()]
}
fn default_prefetch() -> u16 {
    256
}

impl IngressConfig {
    /// AMQP: the exchange (`""` on a Kafka trigger).
    pub fn exchange_name(&self) -> &str {
        self.exchange.as_deref().unwrap_or_default()
    }

    /// AMQP: the queue consumed: `queue`, or `<exchange>.ingress`.
    pub fn queue_name(&self) -> String {
        self.queue
            .clone()
            .unwrap_or_else(|| format!("{}.ingress", self.exchange_name()))
    }

    /// Kafka: the consumer group: `group`, or `delay-bridge.<trigger>`.
    pub fn group_name(&self, trigger: &str) -> String {
        self.group
            .clone()
            .unwrap_or_else(|| format!("delay-bridge.{trigger}"))
    }
}

/// With an ingress, `payload` and `format` default to `hash` and `envelope` (messages are
/// stored by id, with their properties): filled in before the trigger is deserialized, so an
/// explicit other value is still seen, and refused by [`problems`].
pub(super) fn imply_storage(trigger: &mut figment::value::Value) {
    use figment::value::Value;
    if let Value::Dict(_, dict) = trigger {
        if dict.contains_key("ingress") {
            for (key, value) in [("payload", "hash"), ("format", "envelope")] {
                dict.entry(key.to_string())
                    .or_insert_with(|| Value::from(value.to_string()));
            }
        }
    }
}

/// The problems of `t.ingress` on `sink`, each with its field under the trigger.
pub(super) fn problems(t: &TriggerConfig, sink: &SinkConfig) -> Vec<(String, String)> {
    let Some(ingress) = &t.ingress else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if t.payload != PayloadMode::Hash {
        out.push((
            "payload".into(),
            "a trigger with an ingress stores messages by id: `hash` (the default with an ingress)"
                .into(),
        ));
    }
    if t.format != MessageFormat::Envelope {
        out.push((
            "format".into(),
            "a trigger with an ingress stores each message with its properties: `envelope` (the default with an ingress)"
                .into(),
        ));
    }
    let (own, other) = match sink {
        SinkConfig::Amqp(_) => (amqp_problems(t, ingress), ["topic", "group"]),
        SinkConfig::Kafka(_) => (kafka_problems(t, ingress), ["exchange", "queue"]),
        SinkConfig::Http(_) => {
            out.push((
                "ingress".into(),
                format!(
                    "sink `{}` is an HTTP sink: an ingress takes messages in through the trigger's \
                     broker, so only RabbitMQ and Kafka sinks have one",
                    t.sink
                ),
            ));
            return out;
        }
    };
    out.extend(own);
    let set = |f: &str| match f {
        "topic" => ingress.topic.is_some(),
        "group" => ingress.group.is_some(),
        "exchange" => ingress.exchange.is_some(),
        _ => ingress.queue.is_some() || ingress.queue_type.is_some(),
    };
    for field in other.into_iter().filter(|f| set(f)) {
        out.push((
            format!("ingress.{field}"),
            format!(
                "not for {} sink (`{}`): an AMQP ingress takes `exchange`, a Kafka one `topic`",
                match sink {
                    SinkConfig::Amqp(_) => "an AMQP",
                    _ => "a Kafka",
                },
                t.sink
            ),
        ));
    }
    out
}

/// An AMQP name's problem: empty, over 255 bytes, or RabbitMQ's own (`amq.`).
fn amqp_name(name: &str) -> Option<String> {
    if name.is_empty() {
        Some("must not be empty".into())
    } else if name.len() > 255 {
        Some(format!(
            "is {} bytes; AMQP names are at most 255 bytes",
            name.len()
        ))
    } else if name.starts_with("amq.") {
        Some("names starting with `amq.` are reserved by RabbitMQ".into())
    } else {
        None
    }
}

/// The problems of an AMQP trigger's ingress.
fn amqp_problems(t: &TriggerConfig, ingress: &IngressConfig) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut push = |field: &str, why: String| out.push((field.to_string(), why));
    let Some(exchange) = &ingress.exchange else {
        push(
            "ingress.exchange",
            "required on an AMQP trigger: the exchange producers publish to".into(),
        );
        return out;
    };
    let names = [
        ("ingress.exchange", Some(exchange.as_str())),
        ("ingress.queue", ingress.queue.as_deref()),
    ];
    for (field, why) in names
        .into_iter()
        .filter_map(|(field, name)| Some((field, amqp_name(name?)?)))
    {
        push(field, why);
    }
    if ingress.queue.is_none() && ingress.queue_name().len() > 255 {
        push(
            "ingress.exchange",
            "too long to name the default queue `<exchange>.ingress`: set ingress.queue".into(),
        );
    }
    for (field, other) in [
        ("exchange", &t.exchange),
        ("dead_letter_exchange", &t.dead_letter_exchange),
    ] {
        if other.as_deref() == Some(exchange.as_str()) {
            push(
                "ingress.exchange",
                format!(
                    "is the trigger's {field} too: due messages would come back to the ingress"
                ),
            );
        }
    }
    if ingress.exchange_type == ExchangeType::Direct {
        push(
            "ingress.exchange_type",
            "a direct exchange routes only exact keys: use `fanout`, `topic` or `headers`".into(),
        );
    }
    if ingress.queue_type == Some(QueueType::Stream) {
        push(
            "ingress.queue_type",
            "a stream is read by offset, not acknowledged: use `classic` or `quorum`".into(),
        );
    }
    if ingress.binding_keys.is_empty() {
        push(
            "ingress.binding_keys",
            "at least one key (`#`: every key of a topic exchange)".into(),
        );
    }
    if ingress.binding_keys.iter().any(|k| k.len() > 255) {
        push(
            "ingress.binding_keys",
            "AMQP binding keys are at most 255 bytes".into(),
        );
    }
    if ingress.prefetch == 0 {
        push(
            "ingress.prefetch",
            format!("must be between 1 and {MAX_PREFETCH}, got 0"),
        );
    }
    out
}

/// The problems of a Kafka trigger's ingress.
fn kafka_problems(t: &TriggerConfig, ingress: &IngressConfig) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let Some(topic) = &ingress.topic else {
        out.push((
            "ingress.topic".into(),
            "required on a Kafka trigger: the topic producers write to".into(),
        ));
        return out;
    };
    if let Some(why) = crate::envelope::kafka_topic_problem(topic) {
        out.push(("ingress.topic".into(), why.into()));
    }
    for (field, other) in [
        ("topic", &t.topic),
        ("dead_letter_topic", &t.dead_letter_topic),
    ] {
        if other.as_deref() == Some(topic.as_str()) {
            out.push((
                "ingress.topic".into(),
                format!("is the trigger's {field} too: due records would come back to the ingress"),
            ));
        }
    }
    if ingress.group.as_deref() == Some("") {
        out.push(("ingress.group".into(), "must not be empty".into()));
    }
    out
}
