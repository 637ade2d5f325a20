//! `[triggers.ingress]`: producers hand the bridge delayed messages through the broker (an exchange and queue it consumes with `x-delay`), and the checks of that table.

use serde::{Deserialize, Serialize};

use super::{ExchangeType, MessageFormat, PayloadMode, QueueType, SinkConfig, TriggerConfig};

/// Most deliveries the ingress holds unacknowledged at once (`prefetch`): AMQP's limit.
pub const MAX_PREFETCH: u16 = u16::MAX;

/// `[triggers.ingress]` of a trigger whose sink is AMQP: the exchange producers publish to
/// with an `x-delay` header, and the queue the bridge consumes it through.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct IngressConfig {
    /// The exchange producers publish delayed messages to (declared durable by the bridge).
    pub exchange: String,
    /// Its type: `fanout` (default), `topic` or `headers` (every message is taken; a `direct`
    /// exchange routes only exact keys). An exchange that already exists with another type
    /// (the delayed-message plugin's) is used as it is.
    #[serde(default = "default_exchange_type")]
    pub exchange_type: ExchangeType,
    /// The durable queue the bridge consumes, bound to `exchange`. Default: `<exchange>.ingress`.
    #[serde(default)]
    pub queue: Option<String>,
    /// The queue's type (`x-queue-type`): `classic` (default) or `quorum`.
    #[serde(default)]
    pub queue_type: Option<QueueType>,
    /// The keys the queue is bound with (default `["#"]`: every key of a `topic` exchange;
    /// a `fanout` or `headers` exchange ignores them). An exchange of the delayed-message
    /// plugin with `x-delayed-type = direct` needs the routing keys producers use.
    #[serde(default = "default_binding_keys")]
    pub binding_keys: Vec<String>,
    /// Most deliveries held unacknowledged at once (AMQP `basic.qos`), 1 to 65535.
    #[serde(default = "default_prefetch")]
    pub prefetch: u16,
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
    /// The queue consumed: `queue`, or `<exchange>.ingress`.
    pub fn queue_name(&self) -> String {
        self.queue
            .clone()
            .unwrap_or_else(|| format!("{}.ingress", self.exchange))
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
    let mut push = |field: &str, why: String| out.push((field.to_string(), why));
    if !matches!(sink, SinkConfig::Amqp(_)) {
        push(
            "ingress",
            format!(
                "an ingress needs an AMQP sink; sink `{}` is {}",
                t.sink,
                sink.kind()
            ),
        );
        return out;
    }
    if t.payload != PayloadMode::Hash {
        push(
            "payload",
            "a trigger with an ingress stores messages by id: `hash` (the default with an ingress)"
                .into(),
        );
    }
    if t.format != MessageFormat::Envelope {
        push(
            "format",
            "a trigger with an ingress stores each message with its properties: `envelope` (the default with an ingress)"
                .into(),
        );
    }
    let names = [
        ("ingress.exchange", Some(ingress.exchange.as_str())),
        ("ingress.queue", ingress.queue.as_deref()),
    ];
    for (field, name) in names {
        match name {
            Some("") => push(field, "must not be empty".into()),
            Some(n) if n.len() > 255 => push(
                field,
                format!("is {} bytes; AMQP names are at most 255 bytes", n.len()),
            ),
            Some(n) if n.starts_with("amq.") => push(
                field,
                "names starting with `amq.` are reserved by RabbitMQ".into(),
            ),
            _ => {}
        }
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
        if other.as_deref() == Some(ingress.exchange.as_str()) {
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
