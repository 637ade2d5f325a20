//! Blame decided by what the message controls, on a real RabbitMQ: permissions revoked while
//! other channels still cache them, twice in a row; refused messages at the head; returned
//! messages told apart when their producers gave them the same id; a destination that nacks
//! everything held and tried on fresh channels.

use crate::common;
use crate::refusals::{
    assert_none_dead, close_bridge_connections, dead_within, done, envelope, refusal_key,
    restricted, set_topic_permissions,
};

use std::time::Duration;

use common::*;

/// Schedules `n` members `{prefix}-{i}` on `key`, due now.
async fn schedule_named(r: &mut Conn, key: &str, prefix: &str, n: usize) -> Vec<String> {
    let now = redis_now(r).await;
    let members: Vec<String> = (0..n).map(|i| format!("{prefix}-{i}")).collect();
    for (i, m) in members.iter().enumerate() {
        zadd(r, key, now - 1000 + i as i64, m.as_str()).await;
    }
    members
}

/// Topic permissions revoked for every routing key without closing the bridge's connection:
/// RabbitMQ lets a channel that already published a key go on publishing it, so another
/// trigger keeps getting confirmations. The refused trigger's own destination is held all
/// the same: nothing is dead-lettered, in a first outage or a second, whatever else was
/// confirmed meanwhile; once the permissions are back everything arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permissions_revoked_behind_cached_channels_hold_and_dead_letter_nothing() {
    let (rabbit, topic, url) = restricted("#", ".*").await;
    let mut r = redis().await;
    let (key, other) = (refusal_key("cached"), refusal_key("cached-other"));
    let port = free_port();
    let lines = "workers = 1\nmax_attempts = 1\nbackoff_initial = \"100ms\"\n";
    let cfg = ConfigToml::base(port).amqp_sink("rabbit", &url).to_string()
        + &topic.trigger("cached", &key, "cached.k", lines)
        + &topic.trigger("other", &other, "other.k", lines);
    // The other trigger publishes its key first: its channel caches the permission.
    schedule_named(&mut r, &other, "warm", 5).await;
    let bridge = topic
        .bridge_past(&cfg, port, 5, Duration::from_secs(30))
        .await;
    for outage in ["first", "second"] {
        set_topic_permissions(&rabbit, &topic.exchange, "^other\\..*").await;
        if outage == "second" {
            // The bridge's channels now cache the refused trigger's key too (it went through
            // after the first outage): made anew, they ask the broker again.
            close_bridge_connections(&rabbit).await;
        }
        let before = topic.distinct();
        schedule_named(&mut r, &other, &format!("{outage}-other"), 10).await;
        let refused = schedule_named(&mut r, &key, &format!("{outage}-refused"), 30).await;
        let (seen, body) = bridge
            .wait_held("cached", true, Duration::from_secs(20))
            .await;
        assert!(seen, "{outage} outage: held\n{body}\n{}", bridge.log());
        // Several tries of the refused trigger while the other's messages are confirmed.
        topic
            .expect_distinct(before + 10, Duration::from_secs(20), &bridge)
            .await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_none_dead(&mut r, &key, &bridge).await;
        assert!(refused.iter().all(|m| topic.copies(m.as_bytes()) == 0));
        set_topic_permissions(&rabbit, &topic.exchange, ".*").await;
        topic
            .expect_distinct(before + 40, Duration::from_secs(30), &bridge)
            .await;
        let (released, body) = bridge
            .wait_held("cached", false, Duration::from_secs(10))
            .await;
        assert!(released, "{outage} outage: released\n{body}");
    }
    assert_none_dead(&mut r, &key, &bridge).await;
    done(bridge, &mut r, &[&key, &other]).await;
}

/// More messages whose own routing keys are refused than one claim takes, at the head, with
/// good messages behind them: each refused one pays an attempt and waits its backoff away
/// from the head, so the good ones are delivered at once and the refused ones are
/// dead-lettered after `max_attempts`, none of them left unjudged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_messages_at_the_head_do_not_wedge_the_trigger() {
    let (_rabbit, topic, url) = restricted("allowed.#", "^allowed\\..*").await;
    let mut r = redis().await;
    let key = refusal_key("head");
    let now = redis_now(&mut r).await;
    for i in 0..60 {
        let m = envelope(&format!("refused-{i}"), "denied.x");
        zadd(&mut r, &key, now - 60_000 + i, m).await;
    }
    for i in 0..10 {
        let m = envelope(&format!("good-{i}"), "allowed.x");
        zadd(&mut r, &key, now - 30_000 + i, m).await;
    }
    let port = free_port();
    let lines = "format = \"envelope\"\nworkers = 1\nbatch = 20\nmax_attempts = 2\n\
                 backoff_initial = \"1s\"\nbackoff_max = \"2s\"\n";
    let cfg = ConfigToml::base(port).amqp_sink("rabbit", &url).to_string()
        + &topic.trigger("head", &key, "allowed.default", lines);
    let bridge = topic
        .bridge_past(&cfg, port, 10, Duration::from_secs(25))
        .await;
    let last = envelope("refused-59", "denied.x");
    let reason = dead_within(&mut r, &key, &last, Duration::from_secs(60), &bridge).await;
    assert_eq!(reason["reason"], "destination_refused", "{reason}");
    let sizes = wait_drained(&mut r, &key, Duration::from_secs(30)).await;
    assert_eq!(
        sizes,
        (0, 0, 60),
        "every refused one judged\n{}",
        bridge.log()
    );
    done(bridge, &mut r, &[&key]).await;
}

/// Two envelopes in flight with the same `id`, one routed and one returned (its own routing
/// key has no binding): the return goes back to its own publish, by the publish's number.
/// Every returned message is judged (an attempt, then `destination_refused`), none is acked
/// away, and every routed one arrives once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn returns_are_matched_by_publish_not_by_the_producers_id() {
    let capture = AmqpCapture::start("returns").await;
    let mut r = redis().await;
    let key = refusal_key("returns");
    let now = redis_now(&mut r).await;
    let rk = capture.routing_key.clone();
    for i in 0..40 {
        let routed = format!(r#"{{"id": "same", "body": "routed-{i}", "routing_key": "{rk}"}}"#);
        let lost = format!(r#"{{"id": "same", "body": "returned-{i}", "routing_key": "nowhere"}}"#);
        zadd(&mut r, &key, now - 1000 + 2 * i, routed).await;
        zadd(&mut r, &key, now - 999 + 2 * i, lost).await;
    }
    let port = free_port();
    let lines = "format = \"envelope\"\nworkers = 2\nbatch = 40\nmax_attempts = 2\n\
                 backoff_initial = \"100ms\"\nbackoff_max = \"200ms\"";
    let cfg = ConfigToml::base(port).to_string() + &amqp_trigger("returns", &key, &capture, lines);
    let bridge = Bridge::start(&cfg, port);
    bridge
        .expect_arrivals(40, Duration::from_secs(30), || capture.count())
        .await;
    let (_, _, dead) = wait_sizes(&mut r, &key, Duration::from_secs(30), |s| s.2 == 40).await;
    assert_eq!(dead, 40, "every returned message judged\n{}", bridge.log());
    let got = capture.snapshot();
    let mut bodies: Vec<String> = got
        .iter()
        .map(|m| String::from_utf8_lossy(&m.body).into_owned())
        .collect();
    bodies.sort();
    bodies.dedup();
    assert_eq!(bodies.len(), 40, "each routed message once");
    assert!(
        bodies.iter().all(|b| b.starts_with("routed-")),
        "{bodies:?}"
    );
    assert_eq!(got.len(), 40, "none sent twice");
    let reason = dead_reason(
        &mut r,
        &key,
        r#"{"id": "same", "body": "returned-0", "routing_key": "nowhere"}"#,
    )
    .await
    .unwrap();
    assert_eq!(reason["reason"], "destination_refused", "{reason}");
    done(bridge, &mut r, &[&key]).await;
}

/// Declares `queue` on `channel`, bound to `exchange` with key `k`: with `full`, a queue of
/// length 0 that rejects publishes (RabbitMQ nacks each one).
async fn declare_queue(channel: &lapin::Channel, exchange: &str, queue: &str, full: bool) {
    use lapin::options::{QueueBindOptions, QueueDeclareOptions};
    use lapin::types::{AMQPValue, FieldTable};
    let mut args = FieldTable::default();
    if full {
        args.insert("x-max-length".into(), AMQPValue::LongInt(0));
        args.insert(
            "x-overflow".into(),
            AMQPValue::LongString("reject-publish".into()),
        );
    }
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    channel.queue_declare(queue, durable, args).await.unwrap();
    channel
        .queue_bind(
            queue,
            exchange,
            "k",
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
}

/// A destination that nacks every message (a full queue that rejects publishes): the trigger
/// is held, nothing is dead-lettered, and from the second nacked batch in a row each try goes
/// out on a fresh channel (RabbitMQ can keep nacking every publish on a channel opened while
/// a quorum queue's leader moved, where a new channel delivers). Once the queue takes
/// messages, every one arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_that_nacks_every_message_is_held_and_tried_on_fresh_channels() {
    let nacking = Nacking::declare().await;
    let exchange = &nacking.exchange;
    let mut r = redis().await;
    let key = refusal_key("nacks");
    let port = free_port();
    let to = format!("exchange = \"{exchange}\"\nrouting_key = \"k\"\nworkers = 1");
    let cfg = ConfigToml::base(port).to_string() + &trigger("nacks", &key, "rabbit", &to);
    let bridge = Bridge::start(&cfg, port)
        .ready(Duration::from_secs(15))
        .await;
    let members = schedule_named(&mut r, &key, "nacked", 20).await;
    expect_held(&bridge, "nacks", true).await;
    expect_fresh_channels(&bridge).await;
    assert_none_dead(&mut r, &key, &bridge).await;

    // The queue takes messages again: all arrive, once each.
    nacking.take_messages().await;
    expect_held(&bridge, "nacks", false).await;
    nacking.expect(members.len(), &bridge).await;
    assert_eq!(zcard(&mut r, &key).await, 0, "none left in Redis");
    assert_none_dead(&mut r, &key, &bridge).await;
    nacking.delete().await;
    done(bridge, &mut r, &[&key]).await;
}

/// The same for the dead-letter destination: dead letters nacked in full are held, tried on
/// fresh channels, and forwarded once the queue takes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_destination_that_nacks_everything_is_tried_on_fresh_channels() {
    let nacking = Nacking::declare().await;
    let mut r = redis().await;
    let key = refusal_key("dead-nacks");
    let capture = AmqpCapture::start("dead-nacks").await;
    let port = free_port();
    // Ids without bodies: each dead-lettered at its first try (`missing_body`). Letters the
    // broker did not confirm are forwarded again after their lease: a short one.
    let lines = format!(
        "payload = \"hash\"\nmax_attempts = 1\nworkers = 1\nlease = \"2s\"\npublish_timeout = \"1s\"\n\
         dead_letter_exchange = \"{}\"\ndead_letter_routing_key = \"k\"\n",
        nacking.exchange
    );
    let cfg = base_config(port) + &amqp_trigger("dead-nacks", &key, &capture, &lines);
    let bridge = Bridge::start(&cfg, port)
        .ready(Duration::from_secs(15))
        .await;
    let members = schedule_named(&mut r, &key, "bodiless", 10).await;
    expect_held(&bridge, "dead-nacks", true).await;
    expect_fresh_channels(&bridge).await;
    nacking.take_messages().await;
    nacking.expect(members.len(), &bridge).await;
    expect_held(&bridge, "dead-nacks", false).await;
    nacking.delete().await;
    done(bridge, &mut r, &[&key]).await;
}

/// Asserts that `trigger` is held (`held`), or released, within 20 s.
async fn expect_held(bridge: &Bridge, trigger: &str, held: bool) {
    let (seen, body) = bridge
        .wait_held(trigger, held, Duration::from_secs(20))
        .await;
    let what = if held { "held" } else { "released" };
    assert!(seen, "{what}\n{body}\n{}", bridge.log());
}

/// Waits (up to 20 s) until the bridge has tried a held destination on a fresh channel twice.
async fn expect_fresh_channels(bridge: &Bridge) {
    let fresh = |b: &Bridge| {
        b.log()
            .matches("a held destination: a fresh channel")
            .count()
    };
    assert!(
        poll(
            Duration::from_secs(20),
            Duration::from_millis(200),
            async || fresh(bridge),
            |n| *n >= 2,
        )
        .await
        .0,
        "each try on a fresh channel: {}",
        bridge.log()
    );
}

/// An exchange bound (key `k`) to a queue that rejects every publish, on the shared broker;
/// [`Nacking::take_messages`] puts an ordinary queue in its place.
struct Nacking {
    exchange: String,
    queue: String,
    channel: lapin::Channel,
    _conn: lapin::Connection,
}

impl Nacking {
    async fn declare() -> Self {
        use lapin::options::ExchangeDeclareOptions;
        use lapin::types::FieldTable;
        let conn = lapin::Connection::connect(&amqp_url(), lapin::ConnectionProperties::default())
            .await
            .unwrap();
        let channel = conn.create_channel().await.unwrap();
        let (exchange, queue) = (unique("nacks-ex"), unique("nacks-q"));
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        };
        channel
            .exchange_declare(
                &exchange,
                lapin::ExchangeKind::Direct,
                durable,
                FieldTable::default(),
            )
            .await
            .unwrap();
        declare_queue(&channel, &exchange, &queue, true).await;
        Self {
            exchange,
            queue,
            channel,
            _conn: conn,
        }
    }

    /// Replaces the full queue with one that takes messages.
    async fn take_messages(&self) {
        self.delete().await;
        declare_queue(&self.channel, &self.exchange, &self.queue, false).await;
    }

    /// Waits (up to 20 s) until the queue holds `n` messages.
    async fn expect(&self, n: usize, bridge: &Bridge) {
        let count = async || {
            let passive = lapin::options::QueueDeclareOptions {
                passive: true,
                ..Default::default()
            };
            let q = self
                .channel
                .queue_declare(&self.queue, passive, lapin::types::FieldTable::default())
                .await
                .unwrap();
            q.message_count() as usize
        };
        let (all, got) = poll(
            Duration::from_secs(20),
            Duration::from_millis(200),
            count,
            |got| *got >= n,
        )
        .await;
        assert!(all, "{got} of {n} arrived: {}", bridge.log());
    }

    async fn delete(&self) {
        let _ = self
            .channel
            .queue_delete(&self.queue, lapin::options::QueueDeleteOptions::default())
            .await;
    }
}
