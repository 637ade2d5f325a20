//! One claimed member made ready to publish: its body, its envelope's properties, its routing key, topic or URL, and the checks that keep it from the broker (missing, malformed, expired, too large, a routing key, topic or URL not allowed).

use std::borrow::Cow;

use super::json_pointer::{routing_key_at, url_at};
use crate::config::{Destination, MessageFormat, Trigger};
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
    let (body, properties) = read_format(cfg.format(), destination, payload)?;
    let properties = match &tick {
        Some(t) => Some(schedule_header(properties.unwrap_or_default(), t.schedule)),
        None => properties,
    };
    if expires_at(cfg, c, properties.as_ref()).is_some_and(|until| now_ms > until) {
        return Err(PublishError::Expired);
    }
    // The message's own routing key, URL or topic: from its envelope, else (AMQP, HTTP) at
    // the trigger's JSON Pointer; never one its route does not allow. A Kafka topic is not
    // even asked of the broker, which may create topics it is asked about.
    let own = properties.as_ref();
    let (routing_key, url, topic) = match destination {
        Destination::Amqp(route) => {
            let key = own.and_then(|p| p.routing_key.clone());
            let key = own_or_at(key, route.routing.pointer(), &body, routing_key_at)?;
            let key = allowed(key, |k| route.allows(k), PublishError::RouteNotAllowed)?;
            (key, None, None)
        }
        Destination::Http(route) => {
            let url = own.and_then(|p| p.url.clone());
            let url = own_or_at(url, route.url.pointer(), &body, url_at)?;
            let url = allowed(url, |u| route.allows(u), PublishError::UrlNotAllowed)?;
            (None, url, None)
        }
        Destination::Kafka(route) => {
            let topic = own.and_then(|p| p.topic.clone());
            let topic = allowed(topic, |t| route.allows(t), PublishError::TopicNotAllowed)?;
            (None, None, topic)
        }
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

/// The body to publish and, for a trigger that reads envelopes, the envelope's properties.
fn read_format<'a>(
    format: MessageFormat,
    destination: &Destination,
    payload: &'a [u8],
) -> Result<(Cow<'a, [u8]>, Option<Properties>), PublishError> {
    match format {
        MessageFormat::Raw => Ok((Cow::Borrowed(payload), None)),
        MessageFormat::Envelope => {
            let broker = match destination {
                Destination::Amqp(_) => envelope::Broker::Amqp,
                Destination::Kafka(_) => envelope::Broker::Kafka,
                Destination::Http(_) => envelope::Broker::Http,
            };
            let e = envelope::parse(payload, broker).map_err(PublishError::BadEnvelope)?;
            Ok((Cow::Owned(e.body), Some(e.properties)))
        }
    }
}

/// `p` with the schedule header naming `schedule`, in place of any the payload carried.
fn schedule_header(mut p: Properties, schedule: &str) -> Properties {
    p.headers
        .retain(|(name, _)| !name.eq_ignore_ascii_case(HEADER_SCHEDULE));
    p.headers
        .push((HEADER_SCHEDULE.into(), HeaderValue::Text(schedule.into())));
    p
}

/// When `c` expires, in epoch ms: the sooner of the trigger's `expire_after` past its due
/// time and the envelope's own expiry; `None`: never.
fn expires_at(cfg: &Trigger, c: &Claimed, properties: Option<&Properties>) -> Option<i64> {
    // Lateness is measured from the score; a score of 0 or below (or -inf) means "now" and
    // has no due time to be late against.
    let late = cfg.expire_after().filter(|_| c.due_ms > 0).map(|d| {
        c.due_ms
            .saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    });
    [late, properties.and_then(|p| p.expires_at_ms)]
        .into_iter()
        .flatten()
        .min()
}

/// The message's own value if the envelope gave one, else the string at the trigger's
/// JSON Pointer in the body, read by `at`; `None` if neither.
fn own_or_at(
    own: Option<String>,
    pointer: Option<&str>,
    body: &[u8],
    at: fn(&[u8], &str) -> Result<String, PublishError>,
) -> Result<Option<String>, PublishError> {
    match (own, pointer) {
        (Some(own), _) => Ok(Some(own)),
        (None, Some(pointer)) => at(body, pointer).map(Some),
        (None, None) => Ok(None),
    }
}

/// `value` if the route `allows` it (or there is none), else the refusal `refused` names.
fn allowed(
    value: Option<String>,
    allows: impl Fn(&str) -> bool,
    refused: fn(String) -> PublishError,
) -> Result<Option<String>, PublishError> {
    match value {
        Some(v) if !allows(&v) => Err(refused(v)),
        v => Ok(v),
    }
}
