//! The ingress's configuration: `check` prints each ingress, the rules name their keys (exit 78), and a reload that changes an ingress replaces it: the new one consumes, readiness holds.

use crate::common;

use std::time::Duration;

use common::ingress::*;
use common::*;
use lapin::types::AMQPValue;

#[test]
fn check_prints_the_ingress_and_the_rules_name_their_keys() {
    let sink = "[sinks.r]\ntype = \"amqp\"\nurl = \"amqp://guest:guest@127.0.0.1:5672/%2f\"\n";
    let trigger = |lines: &str| {
        format!("{sink}\n[[triggers]]\nname = \"t\"\nkey = \"k\"\nsink = \"r\"\nexchange = \"orders\"\n{lines}")
    };
    let (code, out) = check(&trigger(
        "[triggers.ingress]\nexchange = \"orders.delayed\"\nqueue_type = \"quorum\"",
    ));
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("payload=hash"), "{out}");
    assert!(out.contains("format=envelope"), "{out}");
    assert!(out.contains("trigger t ingress: amqp exchange=orders.delayed (fanout) queue=orders.delayed.ingress (quorum)"), "{out}");
    let kafka = "[sinks.k]\ntype = \"kafka\"\nbrokers = \"127.0.0.1:9092\"\n[[triggers]]\nname = \"kt\"\nkey = \"kk\"\nsink = \"k\"\ntopic = \"out\"\n";
    let (code, out) = check(&format!("{kafka}[triggers.ingress]\ntopic = \"in\""));
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("trigger kt ingress: kafka topic=in group=delay-bridge.kt"),
        "{out}"
    );
    let own = "allowed_topics = ['orders\\..*']\n[triggers.ingress]\ntopic = \"in\"";
    let (code, out) = check(&format!("{kafka}{own}"));
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(r#"allowed_topics=["orders\\..*"]"#), "{out}");
    for (lines, key, why) in [
        (
            "[triggers.ingress]\nexchange = \"d\"",
            "triggers[0].ingress.topic",
            "required",
        ),
        (
            "[triggers.ingress]\ntopic = \"out\"",
            "triggers[0].ingress.topic",
            "come back",
        ),
        (
            "[triggers.ingress]\ntopic = \"in\"\nexchange = \"d\"",
            "triggers[0].ingress.exchange",
            "not for a Kafka sink",
        ),
        (
            "[triggers.ingress]\ntopic = \"a b\"",
            "triggers[0].ingress.topic",
            "249",
        ),
        (
            "allowed_topics = ['i.']\n[triggers.ingress]\ntopic = \"in\"",
            "triggers[0].allowed_topics",
            "come back to the ingress",
        ),
        (
            "allowed_topics = ['orders(']\n[triggers.ingress]\ntopic = \"in\"",
            "triggers[0].allowed_topics",
            "not a regular expression",
        ),
    ] {
        let (code, out) = check(&format!("{kafka}{lines}"));
        assert_eq!(code, 78, "{lines}: {out}");
        assert!(
            out.contains(key) && out.contains(why),
            "{lines}: wanted {key} ({why}) in\n{out}"
        );
    }
    for (lines, key, why) in [
        (
            "[triggers.ingress]\nqueue = \"q\"",
            "triggers[0].ingress.exchange",
            "required",
        ),
        (
            "[triggers.ingress]\nexchange = \"d\"\ntopic = \"t\"",
            "triggers[0].ingress.topic",
            "not for an AMQP sink",
        ),
        (
            "payload = \"inline\"\n[triggers.ingress]\nexchange = \"d\"",
            "triggers[0].payload",
            "by id",
        ),
        (
            "format = \"raw\"\n[triggers.ingress]\nexchange = \"d\"",
            "triggers[0].format",
            "envelope",
        ),
        (
            "[triggers.ingress]\nexchange = \"orders\"",
            "triggers[0].ingress.exchange",
            "come back",
        ),
        (
            "[triggers.ingress]\nexchange = \"d\"\nexchange_type = \"direct\"",
            "triggers[0].ingress.exchange_type",
            "fanout",
        ),
        (
            "[triggers.ingress]\nexchange = \"d\"\nqueue_type = \"stream\"",
            "triggers[0].ingress.queue_type",
            "quorum",
        ),
        (
            "[triggers.ingress]\nexchange = \"d\"\nprefetch = 0",
            "triggers[0].ingress.prefetch",
            "between 1 and 65535",
        ),
        (
            "[triggers.ingress]\nexchange = \"d\"\nbinding_keys = []",
            "triggers[0].ingress.binding_keys",
            "at least one",
        ),
        (
            "[triggers.ingress]\nexchange = \"amq.direct\"",
            "triggers[0].ingress.exchange",
            "reserved",
        ),
        (
            "[triggers.ingress]\nexchange = \"d\"\ncolour = 1",
            "triggers[0].ingress.colour",
            "unknown field",
        ),
    ] {
        let (code, out) = check(&trigger(lines));
        assert_eq!(code, 78, "{lines}: {out}");
        assert!(
            out.contains(key) && out.contains(why),
            "{lines}: wanted {key} ({why}) in\n{out}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_changes_an_ingress_replaces_it() {
    let capture = AmqpCapture::start("rl").await;
    let broker = IngressBroker::new().await;
    let key = unique("ingress-reload");
    let port = free_port();
    let cfg = |prefetch: u16| {
        base_config(port)
            + &amqp_trigger(
                "reload",
                &key,
                &capture,
                &broker.table(&format!("prefetch = {prefetch}")),
            )
    };
    let bridge = Bridge::start(&cfg(10), port)
        .ready(Duration::from_secs(30))
        .await;
    let now = || delayed(AMQPValue::LongInt(0), &[]);
    broker.publish("rl", b"before", now()).await;
    bridge
        .expect_arrivals(1, Duration::from_secs(10), || capture.count())
        .await;
    bridge.reload(&cfg(20)).await;
    bridge.expect_readyz(200, Duration::from_secs(10)).await;
    // The old ingress's end does not clear what the new one says, nor the reverse.
    tokio::time::sleep(Duration::from_secs(1)).await;
    bridge.expect_readyz(200, Duration::from_secs(1)).await;
    broker.publish("rl", b"after", now()).await;
    bridge
        .expect_arrivals(2, Duration::from_secs(10), || capture.count())
        .await;
    let bodies: Vec<Vec<u8>> = capture.snapshot().into_iter().map(|m| m.body).collect();
    assert_eq!(bodies, [b"before".to_vec(), b"after".to_vec()]);
    broker.delete().await;
    cleanup_keys(&mut redis().await, &key).await;
}
