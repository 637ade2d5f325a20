//! How a Kafka error counts: the message's fault (dead-lettered), the cluster's (retried with
//! backoff) or the producer's (put back), with a bounded label for the metrics.

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::sink::blame::KafkaBlame;
use crate::sink::PublishError;

/// Maps a Kafka error to a publish error, with whose it is (see [`crate::sink::blame`]):
/// the record's own (too large, invalid: an attempt), the topic's (unknown, not authorized:
/// held, or an attempt when the record chose its topic) or the cluster's (held). Errors of
/// the producer itself put the message back unattempted and break the sink.
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
    let blame = match code {
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
            | RDKafkaErrorCode::InvalidMessageSize
            | RDKafkaErrorCode::InvalidRecord
            | RDKafkaErrorCode::InvalidMessage,
        ) => KafkaBlame::Message,
        Some(
            RDKafkaErrorCode::UnknownTopicOrPartition
            | RDKafkaErrorCode::UnknownTopic
            | RDKafkaErrorCode::TopicAuthorizationFailed
            | RDKafkaErrorCode::InvalidTopic
            | RDKafkaErrorCode::TopicDeletionDisabled
            // Not produced to its topic's leader in time (a topic the cluster lacks times out
            // so): the topic's, so a record's own topic pays, the trigger's is held.
            | RDKafkaErrorCode::MessageTimedOut,
        ) => KafkaBlame::Topic,
        _ => KafkaBlame::Cluster,
    };
    PublishError::Kafka {
        code: code.map_or_else(|| "other".to_string(), snake_case),
        message: e.to_string(),
        blame,
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
    use crate::sink::blame::{Fault, Part};

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
        assert_eq!(e.fault(), Fault::Message);
    }

    #[test]
    fn the_topic_and_the_cluster_are_the_destinations() {
        use RDKafkaErrorCode::*;
        let cases = [
            (UnknownTopicOrPartition, Part::Topic, false),
            (UnknownTopic, Part::Topic, false),
            (TopicAuthorizationFailed, Part::Topic, false),
            (MessageTimedOut, Part::Topic, false),
            (RequestTimedOut, Part::Sink, false),
            (NotEnoughReplicas, Part::Sink, false),
            (Fatal, Part::Sink, true),
            (PurgeQueue, Part::Sink, true),
            (AllBrokersDown, Part::Sink, true),
        ];
        // The third field: the error also marks the sink broken.
        for (code, part, breaks) in cases {
            let e = produce_error(code);
            assert_eq!(e.fault(), Fault::Destination(part), "{code:?}");
            assert!(!breaks || e.breaks_sink(), "{code:?}");
        }
    }
}
