//! One claimed member made ready to publish: its body, its envelope's properties, its routing key, topic or URL, and the checks that keep it from the broker (missing, malformed, expired, too large, a routing key, topic or URL not allowed).

use std::borrow::Cow;

use super::route::{routing_key_at, url_at};
use crate::config::{AmqpRouting, Destination, HttpTarget, MessageFormat, Trigger};
use crate::envelope::{self, HeaderValue, Properties};
use crate::redis::store::{Body, Claimed};
use crate::sink::PublishError;
use crate::wire::HEADER_SCHEDULE;

/// What is published for one member.
#[derive(Debug)]
pub(super) struct Prepared<'a> {
    /// The body, byte for byte.
    pub body: Cow<'a, [u8]>,
    /// AMQP: the message's own routing key (envelope or JSON Pointer), if any.
    pub routing_key: Option<String>,
    /// The envelope's properties, if the trigger reads envelopes.
    pub properties: Option<Properties>,
    /// HTTP: the message's own URL (envelope or JSON Pointer), if any.
    pub url: Option<String>,
    /// Kafka: the message's own topic (envelope), if any, allowed by `allowed_topics`.
    pub topic: Option<String>,
    /// A schedule's tick: the tick time, the due time consumers see whatever its retries.
    pub tick_ms: Option<i64>,
}

/// Makes `c` ready to publish, or says why it must not be: `now_ms` is the claim's time on
/// the Redis clock, against which expiry is judged.
pub(super) fn prepare<'a>(
    cfg: &Trigger,
    destination: &Destination,
    c: &'a Claimed,
    now_ms: i64,
) -> Result<Prepared<'a>, PublishError> {
    // A schedule's tick: its member names the schedule and carries the body inline.
    let tick = crate::schedule::tick::parse(&c.member);
    let payload = match &c.body {
        Body::Missing => return Err(PublishError::MissingBody),
        Body::TooLarge(_) => return Err(PublishError::TooLarge),
        Body::Member => tick.as_ref().and_then(|t| t.body).unwrap_or(&c.member),
        Body::Stored(body) => body.as_slice(),
    };
    let (body, properties) = match cfg.format() {
        MessageFormat::Raw => (Cow::Borrowed(payload), None),
        MessageFormat::Envelope => {
            let broker = match destination {
                Destination::Amqp(_) => envelope::Broker::Amqp,
                Destination::Kafka(_) => envelope::Broker::Kafka,
                Destination::Http(_) => envelope::Broker::Http,
            };
            let e = envelope::parse(payload, broker).map_err(PublishError::BadEnvelope)?;
            (Cow::Owned(e.body), Some(e.properties))
        }
    };
    let properties = match &tick {
        Some(t) => {
            let mut p = properties.unwrap_or_default();
            p.headers
                .retain(|(name, _)| !name.eq_ignore_ascii_case(HEADER_SCHEDULE));
            p.headers
                .push((HEADER_SCHEDULE.into(), HeaderValue::Text(t.schedule.into())));
            Some(p)
        }
        None => properties,
    };
    // Lateness is measured from the score; a score of 0 or below (or -inf) means "now" and
    // has no due time to be late against.
    let late = cfg.expire_after().filter(|_| c.due_ms > 0).map(|d| {
        c.due_ms
            .saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    });
    let until = [late, properties.as_ref().and_then(|p| p.expires_at_ms)]
        .into_iter()
        .flatten()
        .min();
    if until.is_some_and(|until| now_ms > until) {
        return Err(PublishError::Expired);
    }
    let routing_key = match destination {
        Destination::Amqp(route) => {
            let own = properties.as_ref().and_then(|p| p.routing_key.clone());
            let key = match (own, &route.routing) {
                (Some(key), _) => Some(key),
                (None, AmqpRouting::Pointer(pointer)) => Some(routing_key_at(&body, pointer)?),
                (None, AmqpRouting::Key(_)) => None,
            };
            if let Some(key) = &key {
                if !route.allows(key) {
                    return Err(PublishError::RouteNotAllowed(key.clone()));
                }
            }
            key
        }
        Destination::Kafka(_) | Destination::Http(_) => None,
    };
    let url = match destination {
        Destination::Http(route) => {
            let own = properties.as_ref().and_then(|p| p.url.clone());
            let url = match (own, &route.url) {
                (Some(url), _) => Some(url),
                (None, HttpTarget::Pointer(pointer)) => Some(url_at(&body, pointer)?),
                (None, HttpTarget::Url(_)) => None,
            };
            if let Some(url) = &url {
                if !route.allows(url) {
                    return Err(PublishError::UrlNotAllowed(url.clone()));
                }
            }
            url
        }
        _ => None,
    };
    let topic = match destination {
        Destination::Kafka(route) => match properties.as_ref().and_then(|p| p.topic.clone()) {
            // Never produced to a topic the trigger does not allow: not even asked of the
            // broker, which may create topics it is asked about.
            Some(topic) if !route.allows(&topic) => {
                return Err(PublishError::TopicNotAllowed(topic));
            }
            own => own,
        },
        _ => None,
    };
    if body.len() > cfg.max_message_bytes() {
        return Err(PublishError::TooLarge);
    }
    Ok(Prepared {
        body,
        routing_key,
        properties,
        url,
        topic,
        tick_ms: tick.map(|t| t.tick_ms),
    })
}
