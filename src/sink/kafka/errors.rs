//! How a Kafka error counts: the message's fault (dead-lettered), the cluster's (retried with
//! backoff) or the producer's (put back), with a bounded label for the metrics.

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::sink::PublishError;

/// Maps a Kafka error to a publish error.
///
/// Only errors about the message itself are permanent (dead-lettered at once). A missing topic
/// or a denied authorization is retried with backoff, like an unroutable AMQP message, so an
/// operator has `max_attempts` worth of backoff to fix the cluster before messages are
/// dead-lettered. Errors of the producer itself put the message back unattempted.
pub(super) fn classify(e: &KafkaError) -> PublishError {
    let code = e.rdkafka_error_code();
    if matches!(
        code,
        Some(
            RDKafkaErrorCode::Fatal
                | RDKafkaErrorCode::PurgeQueue
                | RDKafkaErrorCode::PurgeInflight
                | RDKafkaErrorCode::AllBrokersDown
                | RDKafkaErrorCode::BrokerTransportFailure
        )
    ) {
        return PublishError::Connection(e.to_string());
    }
    let permanent = matches!(
        code,
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::InvalidMessageSize
                | RDKafkaErrorCode::InvalidRecord
        )
    );
    PublishError::Kafka {
        code: code.map_or_else(|| "other".to_string(), snake_case),
        message: e.to_string(),
        permanent,
    }
}

/// `MessageSizeTooLarge` -> `message_size_too_large`: a bounded label from the error enum.
fn snake_case(code: RDKafkaErrorCode) -> String {
    let name = format!("{code:?}");
    let mut out = String::with_capacity(name.len() + 4);
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::Disposition;

    fn produce_error(code: RDKafkaErrorCode) -> PublishError {
        classify(&KafkaError::MessageProduction(code))
    }

    #[test]
    fn error_codes_become_bounded_labels() {
        assert_eq!(
            snake_case(RDKafkaErrorCode::MessageSizeTooLarge),
            "message_size_too_large"
        );
        let e = produce_error(RDKafkaErrorCode::MessageSizeTooLarge);
        assert_eq!(e.reason(), "kafka_message_size_too_large");
        assert_eq!(e.disposition(), Disposition::DeadLetter);
    }

    #[test]
    fn only_message_errors_dead_letter_at_once() {
        for code in [
            RDKafkaErrorCode::RequestTimedOut,
            RDKafkaErrorCode::MessageTimedOut,
            RDKafkaErrorCode::NotEnoughReplicas,
            RDKafkaErrorCode::InvalidMessage,
            RDKafkaErrorCode::UnknownTopicOrPartition,
            RDKafkaErrorCode::UnknownTopic,
            RDKafkaErrorCode::TopicAuthorizationFailed,
        ] {
            assert_eq!(
                produce_error(code).disposition(),
                Disposition::Retry,
                "{code:?}"
            );
        }
        for code in [
            RDKafkaErrorCode::Fatal,
            RDKafkaErrorCode::PurgeQueue,
            RDKafkaErrorCode::AllBrokersDown,
        ] {
            let e = produce_error(code);
            assert_eq!(e.disposition(), Disposition::PutBack, "{code:?}");
            assert!(e.breaks_sink());
        }
    }
}
