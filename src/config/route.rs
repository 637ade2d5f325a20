//! A trigger's destination, resolved once at load against the type of its sink.

use serde::Serialize;

use super::{KafkaKey, SinkConfig, TopicPatterns, TriggerConfig};

/// Where a trigger's messages go; a publisher is built with it, so a route can only ever
/// meet a sink of its own kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Destination {
    /// An AMQP exchange.
    Amqp(AmqpRoute),
    /// A Kafka topic.
    Kafka(KafkaRoute),
    /// An HTTP endpoint.
    Http(HttpRoute),
}

/// The URL a trigger's messages are sent to, the method, and the URLs a message may choose.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HttpRoute {
    /// How each message's URL is chosen (an envelope's `url` comes first).
    pub url: HttpTarget,
    /// The request method (upper case).
    pub method: String,
    /// `allowed_urls`: patterns a message's own URL must match (`None`: no own URLs).
    pub allowed_urls: Option<Vec<String>>,
}

impl HttpRoute {
    /// Whether a message may be sent to its own URL `url`.
    pub fn allows(&self, url: &str) -> bool {
        self.allowed_urls
            .as_ref()
            .is_some_and(|patterns| patterns.iter().any(|p| super::url_match(p, url)))
    }

    /// The trigger's own URL, if it has one (not a pointer).
    pub fn fixed_url(&self) -> Option<&str> {
        match &self.url {
            HttpTarget::Url(u) => Some(u),
            HttpTarget::Pointer(_) => None,
        }
    }
}

/// How an HTTP message's URL is chosen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum HttpTarget {
    /// The same URL for every message.
    Url(String),
    /// The string at this JSON Pointer in each payload.
    Pointer(String),
}

impl HttpTarget {
    /// The JSON Pointer each message's URL is read at, if it is read from the payload.
    pub fn pointer(&self) -> Option<&str> {
        match self {
            Self::Pointer(pointer) => Some(pointer),
            Self::Url(_) => None,
        }
    }
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

impl AmqpRouting {
    /// The JSON Pointer each message's routing key is read at, if it is read from the payload.
    pub fn pointer(&self) -> Option<&str> {
        match self {
            Self::Pointer(pointer) => Some(pointer),
            Self::Key(_) => None,
        }
    }
}

/// A topic, what each record's key is, and the topics a record may choose.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KafkaRoute {
    /// Topic name.
    pub topic: String,
    /// Record key.
    pub key: KafkaKey,
    /// `allowed_topics`: the topics a record's own topic must match (`None`: no own topics).
    pub allowed_topics: Option<TopicPatterns>,
}

impl KafkaRoute {
    /// Whether a record may be produced to its own topic `topic`.
    pub fn allows(&self, topic: &str) -> bool {
        self.allowed_topics
            .as_ref()
            .is_some_and(|p| p.allows(topic))
    }
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
            Destination::Http(r) => match &r.url {
                HttpTarget::Url(u) => write!(f, "{} {}", r.method, crate::secret::redact_url(u)),
                HttpTarget::Pointer(p) => write!(f, "{} url_pointer={p:?}", r.method),
            },
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
    let own = sink.kind();
    for (field, set, kind) in sink_fields(t) {
        if set && kind != own {
            problems.push((
                field,
                format!("only for {kind} sinks; this trigger's sink is {own}"),
            ));
        }
    }
    let destination = match sink {
        SinkConfig::Http(_) => http_route(t, &mut problems).map(Destination::Http),
        SinkConfig::Amqp(_) => amqp_route(t, &mut problems).map(Destination::Amqp),
        SinkConfig::Kafka(_) => kafka_route(t, &mut problems).map(Destination::Kafka),
    };
    match destination {
        Some(d) if problems.is_empty() => Ok(d),
        _ => Err(problems),
    }
}

/// The trigger fields that belong to one type of sink: (field, set, sink type).
fn sink_fields(t: &TriggerConfig) -> [(&'static str, bool, &'static str); 11] {
    [
        ("url", t.url.is_some(), "http"),
        ("url_pointer", t.url_pointer.is_some(), "http"),
        ("method", t.method.is_some(), "http"),
        ("allowed_urls", t.allowed_urls.is_some(), "http"),
        ("exchange", t.exchange.is_some(), "amqp"),
        ("routing_key", t.routing_key.is_some(), "amqp"),
        (
            "routing_key_pointer",
            t.routing_key_pointer.is_some(),
            "amqp",
        ),
        (
            "allowed_routing_keys",
            t.allowed_routing_keys.is_some(),
            "amqp",
        ),
        ("topic", t.topic.is_some(), "kafka"),
        ("kafka_key", t.kafka_key.is_some(), "kafka"),
        ("allowed_topics", t.allowed_topics.is_some(), "kafka"),
    ]
}

/// The AMQP route of `t`: the exchange (required), the routing key or its pointer, the
/// allowed routing keys; problems are pushed to `problems`.
fn amqp_route(t: &TriggerConfig, problems: &mut Vec<(&'static str, String)>) -> Option<AmqpRoute> {
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
    let Some(exchange) = &t.exchange else {
        problems.push((
            "exchange",
            "required for an amqp sink (use \"\" for the default exchange)".into(),
        ));
        return None;
    };
    Some(AmqpRoute {
        exchange: exchange.clone(),
        routing,
        allowed_routing_keys: t.allowed_routing_keys.clone(),
    })
}

/// The Kafka route of `t`: the topic (required, not empty), the key and the topics a
/// record may choose.
fn kafka_route(
    t: &TriggerConfig,
    problems: &mut Vec<(&'static str, String)>,
) -> Option<KafkaRoute> {
    let allowed_topics = match t.allowed_topics.as_deref().map(TopicPatterns::new) {
        None => None,
        Some(Ok(patterns)) => {
            // A record produced to the ingress topic would be taken in again, and again.
            let ingress = t.ingress.as_ref().and_then(|i| i.topic.as_deref());
            if let Some(topic) = ingress.filter(|topic| patterns.allows(topic)) {
                problems.push((
                    "allowed_topics",
                    format!(
                        "allows the ingress topic `{topic}`: records produced there would come back to the ingress"
                    ),
                ));
            }
            Some(patterns)
        }
        Some(Err(whys)) => {
            problems.extend(whys.into_iter().map(|why| ("allowed_topics", why)));
            None
        }
    };
    match &t.topic {
        None => {
            problems.push(("topic", "required for a kafka sink".into()));
            None
        }
        Some(topic) if topic.is_empty() => {
            problems.push(("topic", "must not be empty".into()));
            None
        }
        Some(topic) => Some(KafkaRoute {
            topic: topic.clone(),
            key: t.kafka_key.unwrap_or_default(),
            allowed_topics,
        }),
    }
}

/// The HTTP route of `t`: `url` or `url_pointer` (with `allowed_urls`), the method, and
/// the patterns; problems are pushed to `problems`.
fn http_route(t: &TriggerConfig, problems: &mut Vec<(&'static str, String)>) -> Option<HttpRoute> {
    if let Some(patterns) = &t.allowed_urls {
        if patterns.is_empty() {
            problems.push((
                "allowed_urls",
                "an empty list allows nothing: remove it so that messages cannot choose their URL"
                    .into(),
            ));
        }
        for p in patterns {
            if let Some(why) = super::urls::pattern_problem(p) {
                problems.push(("allowed_urls", why));
            }
        }
    }
    let method = t.method.clone().unwrap_or_else(|| "POST".into());
    if !matches!(method.as_str(), "POST" | "PUT" | "PATCH" | "DELETE") {
        problems.push((
            "method",
            format!("`{method}`: one of POST, PUT, PATCH, DELETE (upper case)"),
        ));
    }
    let url = match (&t.url, &t.url_pointer) {
        (Some(_), Some(_)) => {
            problems.push((
                "url_pointer",
                "give `url` or `url_pointer`, not both".into(),
            ));
            return None;
        }
        (None, None) => {
            problems.push((
                "url",
                "required for an http sink (or url_pointer with allowed_urls)".into(),
            ));
            return None;
        }
        (Some(url), None) => {
            match url::Url::parse(url) {
                Ok(u) if !matches!(u.scheme(), "http" | "https") => problems.push((
                    "url",
                    format!("scheme `{}`: use http:// or https://", u.scheme()),
                )),
                Ok(u) if u.host_str().is_none_or(str::is_empty) => {
                    problems.push(("url", "names no host".into()))
                }
                Ok(_) => {}
                Err(e) => problems.push(("url", format!("not a valid URL: {e}"))),
            }
            HttpTarget::Url(url.clone())
        }
        (None, Some(pointer)) => {
            if t.allowed_urls.is_none() {
                problems.push((
                    "url_pointer",
                    "needs allowed_urls: the URLs messages may choose".into(),
                ));
            }
            HttpTarget::Pointer(pointer.clone())
        }
    };
    Some(HttpRoute {
        url,
        method,
        allowed_urls: t.allowed_urls.clone(),
    })
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
                    allowed_topics: None,
                })),
                None => None,
            }
        }
        SinkConfig::Http(_) => {
            for (field, set) in [
                ("dead_letter_exchange", t.dead_letter_exchange.is_some()),
                (
                    "dead_letter_routing_key",
                    t.dead_letter_routing_key.is_some(),
                ),
                ("dead_letter_topic", t.dead_letter_topic.is_some()),
            ] {
                if set {
                    problems.push((
                        field,
                        "not for http sinks: their dead letters stay in Redis".into(),
                    ));
                }
            }
            None
        }
    };
    if problems.is_empty() {
        Ok(destination)
    } else {
        Err(problems)
    }
}
