//! The ingress's producer snippets (`producers/delayed_pika.py`, `producers/delayed_amqplib.js`, `producers/delayed_kafkajs.js`), run as users run them: a message published with `x-delay` arrives no earlier than its delay with its message id (Kafka: its key), one without a delay at once, and one is cancelled by its id.

use crate::common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::ingress::IngressBroker;
use common::*;

/// One snippet: its file, the runtime that runs it, and what it needs installed.
struct Snippet {
    file: &'static str,
    runtime: &'static str,
    needs: &'static str,
}

const PIKA: Snippet = Snippet {
    file: "delayed_pika.py",
    runtime: "python3",
    needs: "python3 and pika (pip install pika)",
};

const KAFKAJS: Snippet = Snippet {
    file: "delayed_kafkajs.js",
    runtime: "node",
    needs: "node and producers/node_modules (npm install --prefix producers)",
};

const AMQPLIB: Snippet = Snippet {
    file: "delayed_amqplib.js",
    runtime: "node",
    needs: "node and producers/node_modules (npm install --prefix producers)",
};

impl Snippet {
    /// Runs the snippet with `args` on the shared RabbitMQ and Kafka, asserting that it
    /// succeeds; returns what it printed.
    async fn run(&self, args: &[&str]) -> String {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("producers")
            .join(self.file);
        let mut cmd = Command::new(self.runtime);
        cmd.arg(path)
            .args(args)
            .env("AMQP_URL", amqp_url())
            .env("KAFKA_BROKERS", kafka_brokers())
            .stdin(Stdio::null());
        let out = tokio::task::spawn_blocking(move || cmd.output())
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("{}: {} installed? ({e})", self.file, self.needs));
        assert!(
            out.status.success(),
            "{} {args:?} (needs {}; scripts/test.sh installs it): {}{}",
            self.file,
            self.needs,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

/// What arrived of the snippet's three messages: the two not cancelled, and no third within
/// half a second more.
async fn the_two_not_cancelled<T: std::fmt::Debug>(
    bridge: &Bridge,
    count: impl Fn() -> usize,
    snapshot: impl Fn() -> Vec<T>,
) -> Vec<T> {
    bridge
        .expect_arrivals(2, Duration::from_secs(20), count)
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got = snapshot();
    assert_eq!(got.len(), 2, "{got:?}");
    got
}

/// A bridge with an ingress; the snippet publishes a delayed message, one due now, and one
/// it then cancels by its id.
async fn delivers_through_the_ingress(snippet: &Snippet) {
    let capture = AmqpCapture::start("snippet").await;
    let broker = IngressBroker::new().await;
    let key = unique("ingress-snippet");
    let port = free_port();
    let config = base_config(port) + &amqp_trigger("snippet", &key, &capture, &broker.table(""));
    let bridge = Bridge::start(&config, port)
        .ready(Duration::from_secs(30))
        .await;
    let ex = broker.exchange.as_str();
    let sent = now_ms();
    snippet
        .run(&[ex, "snippet", "later", "1500", "order-later"])
        .await;
    snippet.run(&[ex, "snippet", "now \"quoted\" ✓", "0"]).await;
    snippet
        .run(&[ex, "snippet", "never", "30000", "order-never"])
        .await;
    let out = cli(&["cancel", "-t", "snippet", "order-never"], &config, &[]);
    assert_eq!(out.code, 0, "{}", out.text());
    let got = the_two_not_cancelled(&bridge, || capture.count(), || capture.snapshot()).await;
    let now = got.iter().find(|m| m.body == "now \"quoted\" ✓".as_bytes());
    let later = got
        .iter()
        .find(|m| m.body == b"later")
        .expect("the delayed one");
    assert!(now.is_some(), "{got:?}");
    assert_eq!(later.message_id.as_deref(), Some("order-later"));
    assert!(
        later.due_ms.unwrap() >= sent + 1_500 && later.at_ms >= sent + 1_500,
        "delivered before its delay: sent {sent}, {later:?}"
    );
    broker.delete().await;
    cleanup_keys(&mut redis().await, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pika_snippet_delivers_through_the_ingress() {
    delivers_through_the_ingress(&PIKA).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_amqplib_snippet_delivers_through_the_ingress() {
    delivers_through_the_ingress(&AMQPLIB).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kafkajs_snippet_delivers_through_the_ingress() {
    use common::kafka::{create_topic, delete_topic, KafkaCapture};
    let key = unique("ingress-kjs");
    let (ingress, dest) = (unique("ingress-kjs-in"), unique("ingress-kjs-out"));
    create_topic(&kafka_brokers(), &ingress, 1).await;
    create_topic(&kafka_brokers(), &dest, 1).await;
    let capture = KafkaCapture::start(&kafka_brokers(), &dest, 1);
    let port = free_port();
    let table = format!("[triggers.ingress]\ntopic = \"{ingress}\"\n");
    let config = ConfigToml::base(port)
        .kafka_sink("kafka", &kafka_brokers(), &[])
        .to_string()
        + &kafka_trigger("kjs", &key, "kafka", &dest, &table);
    let bridge = Bridge::start(&config, port)
        .ready(Duration::from_secs(30))
        .await;
    let sent = now_ms();
    KAFKAJS
        .run(&[&ingress, "customer-9", "later", "1500"])
        .await;
    KAFKAJS.run(&[&ingress, "customer-7", "now", "0"]).await;
    let never = KAFKAJS
        .run(&[&ingress, "customer-5", "never", "30000"])
        .await;
    assert_eq!(never, format!("{ingress}/0/2"));
    // Cancelled by its place, once the bridge has read it.
    let (cancelled, out) = poll(
        Duration::from_secs(10),
        Duration::from_millis(100),
        async || cli(&["cancel", "-t", "kjs", &never], &config, &[]),
        |out| out.code == 0,
    )
    .await;
    assert!(cancelled, "{}", out.text());
    let got = the_two_not_cancelled(&bridge, || capture.count(), || capture.snapshot()).await;
    let later = got
        .iter()
        .find(|r| r.body == b"later")
        .expect("the delayed one");
    assert_eq!(later.key.as_deref(), Some(&b"customer-9"[..]));
    let due: i64 = later.header("x-delay-due-ms").unwrap().parse().unwrap();
    assert!(due >= sent + 1_500, "due {due}, sent {sent}");
    assert!(got.iter().any(|r| r.body == b"now"));
    cleanup_keys(&mut redis().await, &key).await;
    drop(bridge);
    capture.delete().await;
    delete_topic(&kafka_brokers(), &ingress).await;
}
