//! What a message's properties cost on the wire: its content header must fit in one AMQP frame.
//!
//! A content header cannot be split across frames. When a message's properties and headers
//! encode to more than the `frame_max` the connection negotiated, RabbitMQ closes the whole
//! connection (501 FRAME_ERROR), every channel on it with it. So the size is measured as the
//! broker will see it, before publishing: the AMQP field-table encoding, not the sum of names
//! and values (each header adds a length byte, a type tag and, for a string, four length
//! bytes: 21,000 short headers of ~63 KB of text are ~189 KB on the wire).

use lapin::types::{AMQPValue, FieldArray, FieldTable, ShortString};
use lapin::BasicProperties;

/// Frame type, channel and size before the payload, the end marker after it.
const FRAME_OVERHEAD: usize = 1 + 2 + 4 + 1;
/// Class id, weight, body size and property flags of a content header.
const HEADER_FIXED: usize = 2 + 2 + 8 + 2;

/// Bytes of the content header frame that carries `props`.
pub(super) fn header_frame_len(props: &BasicProperties) -> usize {
    let short = |s: Option<&ShortString>| s.map_or(0, |s| 1 + s.as_str().len());
    FRAME_OVERHEAD
        + HEADER_FIXED
        + short(props.content_type().as_ref())
        + short(props.content_encoding().as_ref())
        + props.headers().as_ref().map_or(0, table_len)
        + props.delivery_mode().map_or(0, |_| 1)
        + props.priority().map_or(0, |_| 1)
        + short(props.correlation_id().as_ref())
        + short(props.reply_to().as_ref())
        + short(props.expiration().as_ref())
        + short(props.message_id().as_ref())
        + props.timestamp().map_or(0, |_| 8)
        + short(props.kind().as_ref())
        + short(props.user_id().as_ref())
        + short(props.app_id().as_ref())
        + short(props.cluster_id().as_ref())
}

/// Why `props` cannot be published on a connection whose `frame_max` is `frame_max` (0: no
/// limit), or `None` when it fits.
pub(super) fn too_large(props: &BasicProperties, frame_max: u32) -> Option<String> {
    let len = header_frame_len(props);
    (frame_max > 0 && len > frame_max as usize).then(|| {
        format!(
            "properties and headers encode to {len} bytes, over the broker's frame_max of \
             {frame_max}: fewer or shorter headers"
        )
    })
}

fn table_len(t: &FieldTable) -> usize {
    4 + t
        .inner()
        .iter()
        .map(|(name, v)| 1 + name.as_str().len() + value_len(v))
        .sum::<usize>()
}

fn array_len(a: &FieldArray) -> usize {
    4 + a.as_slice().iter().map(value_len).sum::<usize>()
}

/// A field value with its type tag.
fn value_len(v: &AMQPValue) -> usize {
    1 + match v {
        AMQPValue::Boolean(_) | AMQPValue::ShortShortInt(_) | AMQPValue::ShortShortUInt(_) => 1,
        AMQPValue::ShortInt(_) | AMQPValue::ShortUInt(_) => 2,
        AMQPValue::LongInt(_) | AMQPValue::LongUInt(_) | AMQPValue::Float(_) => 4,
        AMQPValue::LongLongInt(_) | AMQPValue::Double(_) | AMQPValue::Timestamp(_) => 8,
        AMQPValue::DecimalValue(_) => 5,
        AMQPValue::ShortString(s) => 1 + s.as_str().len(),
        AMQPValue::LongString(s) => 4 + s.as_bytes().len(),
        AMQPValue::ByteArray(b) => 4 + b.as_slice().len(),
        AMQPValue::FieldArray(a) => array_len(a),
        AMQPValue::FieldTable(t) => table_len(t),
        AMQPValue::Void => 0,
    }
}

#[cfg(test)]
mod tests {
    use lapin::protocol::basic::gen_properties;
    use lapin::types::LongString;

    use super::*;

    /// What amq-protocol (lapin's encoder) writes for the properties, plus the fixed parts.
    fn encoded(props: &BasicProperties) -> usize {
        let (_, len) = cookie_factory::gen(gen_properties(props), Vec::new()).unwrap();
        // gen_properties writes the flags and the properties: add the rest of the frame.
        FRAME_OVERHEAD + HEADER_FIXED - 2 + len as usize
    }

    #[test]
    fn the_size_is_what_the_encoder_writes() {
        let mut headers = FieldTable::default();
        headers.insert("a".into(), AMQPValue::LongString(LongString::from("xyz")));
        headers.insert("n".into(), AMQPValue::LongLongInt(7));
        headers.insert("b".into(), AMQPValue::Boolean(true));
        let mut inner = FieldTable::default();
        inner.insert("deep".into(), AMQPValue::LongString(LongString::from("v")));
        headers.insert("t".into(), AMQPValue::FieldTable(inner));
        let props = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_correlation_id("c-1".into())
            .with_priority(3)
            .with_expiration("1000".into())
            .with_delivery_mode(2)
            .with_message_id("0123456789abcdef".into())
            .with_headers(headers);
        assert_eq!(header_frame_len(&props), encoded(&props));
        let bare = BasicProperties::default();
        assert_eq!(header_frame_len(&bare), encoded(&bare));
    }

    #[test]
    fn many_short_headers_cost_more_than_their_text() {
        // 21,000 names of three bytes with two-byte values: 105,000 bytes of text, over
        // 189,000 on the wire, over RabbitMQ's default frame_max of 131,072.
        let mut headers = FieldTable::default();
        for i in 0..21_000 {
            headers.insert(
                format!("{:03x}", i % 4096).as_str().into(),
                AMQPValue::LongString(LongString::from("ab")),
            );
        }
        let many = FieldTable::from(
            (0..21_000u32)
                .map(|i| {
                    (
                        ShortString::from(format!("h{i:05}")),
                        AMQPValue::LongString(LongString::from("v")),
                    )
                })
                .collect::<std::collections::BTreeMap<_, _>>(),
        );
        let props = BasicProperties::default().with_headers(many);
        let len = header_frame_len(&props);
        assert_eq!(len, encoded(&props));
        assert!(too_large(&props, 131_072).is_some(), "{len}");
        assert!(too_large(&props, 0).is_none(), "0 means no limit");
        let small = BasicProperties::default().with_headers(headers);
        assert!(too_large(&small, 131_072).is_none());
    }
}
