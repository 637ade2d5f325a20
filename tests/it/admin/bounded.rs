//! Lists over heavy bodies cost Redis, the bridge and the network a bounded amount.

use super::*;

/// Bytes a Redis server has sent to its clients so far.
async fn net_output(r: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(r)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("total_net_output_bytes:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

/// The bridge's resident memory in bytes.
fn rss(bridge: &Bridge) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", bridge.child.id())).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb * 1024
}

/// Lists over large bodies cost Redis, the bridge and the network a bounded amount: 50 dead
/// letters of 8 MB and 400 scheduled bodies of 1 MiB (hash mode), and 8 inline dead letters
/// of 2 MB, listed again and again, block no Redis call for more than a few milliseconds
/// (Redis's own slow log) nor send more than a bounded number of bytes, answer in bounded
/// responses, and leave the bridge's memory flat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_stay_bounded_whatever_the_bodies_weigh() {
    use common::servers::RedisServer;
    let server = RedisServer::start(&[]).await;
    let mut r = server.conn().await;
    let capture = AmqpCapture::start("bounded").await;
    let (port, admin_port) = (free_port(), free_port());
    let (big, inline) = ("delay:{bounded}", "delay:{bounded-inline}");
    let config = ConfigToml::base(port)
        .set_str("redis", "url", &server.url())
        .to_string()
        + &format!("\n[admin]\nlisten = \"127.0.0.1:{admin_port}\"\nread_only = true\n")
        + &amqp_trigger("big", big, &capture, "payload = \"hash\"\n")
        + &amqp_trigger("inline", inline, &capture, "");
    fill_heavy(&mut r, big, inline).await;
    let bridge = Bridge::start(&config, port)
        .ready(Duration::from_secs(20))
        .await;
    let sent_before = watch_slow_calls(&mut r).await;

    let calls = [
        ("/api/v1/triggers/big/dead?limit=50", 64 << 10),
        ("/api/v1/triggers/big/scheduled?limit=400", 128 << 10),
        ("/api/v1/triggers/inline/dead?limit=50", 6 << 20),
        ("/api/v1/triggers/inline/scheduled?limit=50", 6 << 20),
    ];
    let mut before = 0;
    for round in 0..6 {
        for (path, most) in calls {
            let got = request(admin_port, "GET", path, &[], None).await;
            assert_eq!(
                got.status,
                200,
                "{path}: {}\n{}",
                &got.body[..got.body.len().min(300)],
                bridge.log()
            );
            assert!(
                got.body.len() <= most,
                "{path}: {} bytes in one response",
                got.body.len()
            );
        }
        if round == 0 {
            before = rss(&bridge);
        }
    }
    let after = rss(&bridge);
    assert!(
        after < before + (64 << 20),
        "the bridge's memory grew from {before} to {after} bytes"
    );
    // Hash mode: every id listed, with its body's size and no body read.
    let page = request(admin_port, "GET", calls[1].0, &[], None)
        .await
        .json();
    let items = page["items"].as_array().unwrap();
    assert_eq!(items.len(), 400);
    assert_eq!(items[0]["body_size"], 1 << 20, "{}", items[0]);
    // Inline, a member is the message: the page ends at the budget, with a cursor to the rest.
    let page = request(admin_port, "GET", calls[3].0, &[], None)
        .await
        .json();
    let items = page["items"].as_array().unwrap();
    assert!((1..8).contains(&items.len()), "{} items", items.len());
    assert!(
        page["next"].is_string(),
        "a cursor to the rest: {}",
        page["next"]
    );
    let inline_page = request(admin_port, "GET", calls[2].0, &[], None)
        .await
        .json();
    let letters = inline_page["items"].as_array().unwrap().len();
    assert!(
        (1..8).contains(&letters),
        "{letters} inline letters of 2 MB in one page"
    );
    let slow: Vec<Vec<redis::Value>> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(100)
        .query_async(&mut r)
        .await
        .unwrap();
    assert!(slow.is_empty(), "Redis calls over 100 ms: {slow:?}");
    let sent = net_output(&mut r).await - sent_before;
    assert!(sent < 64 << 20, "Redis sent {sent} bytes for 20 list calls");
    bridge.assert_no_panic();
}

/// With Redis down at start, the admin listener is open and answers 503 saying why; once
/// Redis is up, it serves the triggers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_answers_503_until_redis_is_reached() {
    use common::servers::RedisServer;
    let mut server = RedisServer::start(&[]).await;
    server.shutdown().await;
    let capture = AmqpCapture::start("admin-503").await;
    let (port, admin_port) = (free_port(), free_port());
    let config = ConfigToml::base(port)
        .set_str("redis", "url", &server.url())
        .to_string()
        + &format!("\n[admin]\nlisten = \"127.0.0.1:{admin_port}\"\nread_only = true\n")
        + &amqp_trigger("early", "delay:{early}", &capture, "");
    let bridge = Bridge::start(&config, port);
    assert!(
        common::servers::wait_port(admin_port, true, Duration::from_secs(15)).await,
        "the admin listener opens before Redis is reached"
    );
    let starting = (Duration::from_secs(15), Duration::from_millis(100));
    let got = wait_for_triggers(admin_port, 503, starting).await;
    assert!(
        got.json()["error"].as_str().unwrap().contains("starting"),
        "{}",
        got.body
    );
    server.restart().await;
    let restarted = (Duration::from_secs(20), Duration::from_millis(200));
    let got = wait_for_triggers(admin_port, 200, restarted).await;
    assert_eq!(got.json()["triggers"][0]["name"], "early", "{}", got.body);
    bridge.assert_no_panic();
}

/// 50 dead letters of 8 MB and 400 scheduled bodies of 1 MiB on the hash-mode key `big`,
/// 8 members of 2 MB scheduled and dead on the inline key `inline`, all due far ahead.
async fn fill_heavy(r: &mut Conn, big: &str, inline: &str) {
    let keys = QueueKeys::derive(big).unwrap();
    let eight_mb = vec![b'x'; 8 << 20];
    for i in 0..50 {
        let id = format!("dead-{i}");
        let _: () = redis::pipe()
            .zadd(&keys.dead, &id, i)
            .hset(
                &keys.dead_reasons,
                &id,
                r#"{"reason":"too_large","attempts":0}"#,
            )
            .hset(&keys.bodies, &id, &eight_mb)
            .query_async(r)
            .await
            .unwrap();
    }
    let one_mib = vec![b'y'; 1 << 20];
    let later = 4_000_000_000_000i64;
    for i in 0..400 {
        let id = format!("later-{i}");
        let _: () = redis::pipe()
            .zadd(&keys.source, &id, later + i)
            .hset(&keys.bodies, &id, &one_mib)
            .query_async(r)
            .await
            .unwrap();
    }
    let inline_dead = QueueKeys::derive(inline).unwrap().dead;
    for i in 0..8u8 {
        let mut member = vec![b'z'; 2 << 20];
        member[0] = b'0' + i;
        let _: () = redis::AsyncCommands::zadd(r, &inline_dead, &member, i)
            .await
            .unwrap();
        let _: () = redis::AsyncCommands::zadd(r, inline, &member, later + i64::from(i))
            .await
            .unwrap();
    }
}

/// Has Redis log every call slower than 100 ms, from an empty slow log, and returns the
/// bytes it has sent so far.
async fn watch_slow_calls(r: &mut Conn) -> u64 {
    // Redis's own measure of each call, and the bytes it sent: copying the stored bodies
    // (the old way) takes hundreds of milliseconds and moves hundreds of MiB; the bound is
    // generous for a machine busy with other tests.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-log-slower-than")
        .arg(100_000)
        .query_async(r)
        .await
        .unwrap();
    let _: () = redis::cmd("SLOWLOG")
        .arg("RESET")
        .query_async(r)
        .await
        .unwrap();
    net_output(r).await
}

/// Polls the triggers list every `every` until it answers `status`, for up to `timeout`;
/// asserts it did, and returns the answer.
async fn wait_for_triggers(
    admin_port: u16,
    status: u16,
    (timeout, every): (Duration, Duration),
) -> Response {
    let (answered, got) = poll(
        timeout,
        every,
        async || request(admin_port, "GET", TRIGGERS, &[], None).await,
        |r| r.status == status,
    )
    .await;
    assert!(answered, "{} {}", got.status, got.body);
    got
}
