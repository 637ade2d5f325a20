//! One test per row of the table in docs/delivery.md ("Who is at fault").

use super::*;

const NONE: Chosen = Chosen {
    routing_key: false,
    topic: false,
    url: false,
};
/// The message chose its routing key, its topic or its URL.
const KEY: Chosen = Chosen {
    routing_key: true,
    ..NONE
};
const TOPIC: Chosen = Chosen {
    topic: true,
    ..NONE
};
const URL: Chosen = Chosen { url: true, ..NONE };
const HOLD: Verdict = Verdict::PutBack { hold: true };
const BACK: Verdict = Verdict::PutBack { hold: false };

fn attempt(reason: &'static str) -> Verdict {
    Verdict::Attempt {
        reason: reason.into(),
    }
}

fn dead(reason: &'static str) -> Verdict {
    Verdict::DeadLetter {
        reason: reason.into(),
    }
}

fn refused(code: u16, text: &str, part: Part) -> PublishError {
    PublishError::DestinationRefused {
        code,
        text: text.into(),
        part,
    }
}

/// RabbitMQ's 403 for a publish without write access to `what` (the exchange or the topic).
fn access_refused(what: &str, part: Part) -> PublishError {
    refused(
        403,
        &format!("ACCESS_REFUSED - write access to {what}"),
        part,
    )
}

fn kafka(code: &str, blame: KafkaBlame) -> PublishError {
    PublishError::Kafka {
        code: code.into(),
        message: "broker said so".into(),
        blame,
    }
}

fn status(status: u16, every_request: bool) -> PublishError {
    PublishError::HttpStatus {
        status,
        excerpt: String::new(),
        retry_after: None,
        every_request,
    }
}

/// `e` holds the trigger whether or not the message chose its own part (`chosen`).
fn holds_whatever_was_chosen(e: &PublishError, chosen: Chosen) {
    for c in [NONE, chosen] {
        assert_eq!(judge(e, c, false), HOLD, "{e} with {c:?}");
    }
}

/// `e` holds the trigger when the message did not choose the part that failed; when it chose
/// it (`chosen`), an attempt is counted, unless the batch held the trigger anyway.
fn holds_unless_chosen(e: &PublishError, chosen: Chosen) {
    assert_eq!(judge(e, NONE, false), HOLD, "{e}");
    assert_eq!(judge(e, chosen, false), attempt(DESTINATION_REFUSED), "{e}");
    assert_eq!(judge(e, chosen, true), BACK, "{e}");
}

// RabbitMQ.

#[test]
fn amqp_exchange_missing_holds_even_with_a_chosen_routing_key() {
    let e = refused(404, "NOT_FOUND - no exchange 'orders'", Part::Exchange);
    holds_whatever_was_chosen(&e, KEY);
    assert_eq!(
        judge(&PublishError::NoExchange("orders".into()), KEY, false),
        HOLD
    );
}

#[test]
fn amqp_access_refused_to_the_exchange_holds() {
    holds_whatever_was_chosen(&access_refused("exchange", Part::Exchange), KEY);
}

#[test]
fn amqp_access_refused_to_a_routing_key_holds_unless_the_message_chose_it() {
    holds_unless_chosen(&access_refused("topic", Part::RoutingKey), KEY);
}

#[test]
fn amqp_unroutable_is_the_routing_keys() {
    let e = PublishError::Returned("NO_ROUTE".into());
    assert_eq!(judge(&e, NONE, false), HOLD);
    assert_eq!(judge(&e, KEY, false), attempt(DESTINATION_REFUSED));
}

#[test]
fn amqp_alarms_lost_connections_nacks_and_timeouts_hold() {
    for e in [
        PublishError::Blocked,
        PublishError::Connection("reset".into()),
        PublishError::Closed {
            code: 320,
            text: "CONNECTION_FORCED".into(),
        },
        PublishError::Nack,
        PublishError::Timeout,
    ] {
        assert_eq!(judge(&e, NONE, false), HOLD, "{e}");
        assert_eq!(judge(&e, KEY, false), HOLD, "{e}");
    }
}

#[test]
fn amqp_a_message_refused_alone_counts_an_attempt() {
    let e = PublishError::BrokerRefused {
        code: 406,
        text: "PRECONDITION_FAILED - message size".into(),
    };
    assert_eq!(judge(&e, NONE, false), attempt("broker_refused"));
    assert_eq!(judge(&e, NONE, true), attempt("broker_refused"));
}

#[test]
fn amqp_a_header_frame_too_large_is_dead_lettered_at_once() {
    let e = PublishError::FrameTooLarge("headers over frame_max".into());
    assert_eq!(judge(&e, NONE, false), dead("too_large"));
}

// Kafka.

#[test]
fn kafka_unknown_or_forbidden_topic_holds_unless_chosen() {
    for code in ["unknown_topic_or_partition", "topic_authorization_failed"] {
        holds_unless_chosen(&kafka(code, KafkaBlame::Topic), TOPIC);
    }
}

#[test]
fn kafka_brokers_down_hold() {
    holds_whatever_was_chosen(&kafka("all_brokers_down", KafkaBlame::Cluster), TOPIC);
}

#[test]
fn kafka_too_large_or_invalid_counts_an_attempt() {
    let e = kafka("message_size_too_large", KafkaBlame::Message);
    assert_eq!(
        judge(&e, NONE, false),
        attempt("kafka_message_size_too_large")
    );
}

// HTTP.

#[test]
fn http_unreachable_or_slow_holds_unless_chosen() {
    for e in [
        PublishError::HttpConnect("connection refused".into()),
        PublishError::HttpTimeout,
    ] {
        holds_unless_chosen(&e, URL);
    }
}

#[test]
fn http_statuses_of_the_endpoint_hold() {
    for s in [
        301, 302, 303, 401, 403, 404, 405, 408, 410, 425, 429, 500, 502, 503, 504,
    ] {
        assert_eq!(judge(&status(s, false), NONE, false), HOLD, "{s}");
        assert_eq!(
            judge(&status(s, false), URL, false),
            attempt(DESTINATION_REFUSED),
            "{s}"
        );
    }
}

#[test]
fn http_statuses_of_the_message_count_an_attempt() {
    for s in [400, 409, 413, 415, 422] {
        let e = status(s, false);
        let reason: Cow<'static, str> = format!("http_{s}").into();
        assert_eq!(judge(&e, NONE, false), Verdict::Attempt { reason }, "{s}");
    }
}

#[test]
fn http_a_status_every_request_gets_is_the_endpoints() {
    for s in [400, 413, 422] {
        assert_eq!(judge(&status(s, true), NONE, false), HOLD, "{s}");
    }
}

// Every sink.

#[test]
fn what_cannot_be_published_as_it_is_is_dead_lettered_at_once() {
    for e in [
        PublishError::TooLarge,
        PublishError::BadPayload("x".into()),
        PublishError::MissingBody,
        PublishError::BadEnvelope("x".into()),
        PublishError::RouteNotAllowed("x".into()),
        PublishError::TopicNotAllowed("x".into()),
        PublishError::UrlNotAllowed("x".into()),
        PublishError::AddressNotAllowed("x".into()),
        PublishError::Expired,
    ] {
        assert!(
            matches!(judge(&e, NONE, false), Verdict::DeadLetter { .. }),
            "{e}"
        );
    }
}

#[test]
fn a_shutdown_puts_back_and_holds_nothing() {
    assert_eq!(judge(&PublishError::Aborted, NONE, false), BACK);
}

#[test]
fn only_failures_of_the_triggers_own_destination_hold_it() {
    let key = refused(403, "topic", Part::RoutingKey);
    assert!(holds_own(&key, NONE));
    assert!(!holds_own(&key, KEY));
    assert!(holds_own(&refused(404, "no exchange", Part::Exchange), KEY));
    assert!(!holds_own(&PublishError::TooLarge, NONE));
    assert!(!holds_own(&status(400, false), NONE));
}
