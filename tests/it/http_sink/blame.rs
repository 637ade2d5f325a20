//! Whose fault an HTTP failure is, against real endpoints on loopback: a status every request gets is the endpoint's (nothing dead-lettered), a status a few messages get is theirs; an endpoint that drops SYNs or never finishes its TLS handshake is down; redirects that would drop the body are the endpoint's; a reload that corrects the URL starts fresh.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::webhook::*;
use common::*;

use super::{
    expect_all_delivered, expect_kept, expect_settled, hook_lines, http_bridge, http_bridge_with,
    http_config, new_key, scheduled, FAST_RETRY,
};

/// `status` to every request until the endpoint is fixed, then 200: with two attempts, a
/// failure counted against the messages would dead-letter them in well under a second.
async fn every_request_gets(status: u16, tag: &str) {
    let mut r = redis().await;
    let fixed = Arc::new(AtomicBool::new(false));
    let is_fixed = fixed.clone();
    let hook = Webhook::start(move |_, _| match is_fixed.load(Ordering::SeqCst) {
        true => Answer::status(200),
        false => Answer::status(status).body("no such route"),
    })
    .await;
    let n = 20;
    let key = scheduled(&mut r, tag, n).await;
    let lines = hook_lines(
        &hook,
        &format!("max_attempts = 2\nbatch = 20\n{FAST_RETRY}"),
    );
    let bridge = http_bridge(&key, &lines);
    // Each message asked several times: long past what two attempts would take.
    let asked = wait_until(Duration::from_secs(20), || hook.count() >= 3 * n).await;
    assert!(asked, "{} requests\n{}", hook.count(), bridge.log());
    expect_kept(&mut r, &key, n as i64).await;

    fixed.store(true, Ordering::SeqCst);
    expect_all_delivered(&mut r, &key, n, &hook, &bridge).await;
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_404_to_every_request_dead_letters_nothing() {
    every_request_gets(404, "every404").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_to_every_request_dead_letters_nothing() {
    every_request_gets(503, "every503").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_400_to_every_request_dead_letters_nothing() {
    every_request_gets(400, "every400").await;
}

/// A 400 for three messages while the rest go through: those three, and only those, are
/// dead-lettered after `max_attempts`, though their retries end up alone at the endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_400_for_a_few_messages_dead_letters_exactly_those() {
    let mut r = redis().await;
    let bad = [body(3, 0), body(7, 0), body(11, 0)];
    let refused = bad.clone();
    let hook = Webhook::start(move |rq, _| match refused.contains(&rq.body) {
        true => Answer::status(400).body("invalid order: field `sku` missing"),
        false => Answer::status(200),
    })
    .await;
    let n = 20;
    let key = scheduled(&mut r, "few400", n).await;
    let lines = hook_lines(&hook, &format!("max_attempts = 4\n{FAST_RETRY}"));
    let bridge = http_bridge(&key, &lines);
    expect_settled(&mut r, &key, bad.len() as i64, &bridge).await;
    for b in &bad {
        let why = dead_reason(&mut r, &key, b.clone()).await.unwrap();
        assert_eq!(why["reason"], "http_400", "{why}");
        assert!(why["detail"].as_str().unwrap().starts_with("invalid order"));
        assert_eq!(hook.tally()[b], 4, "tried max_attempts times");
    }
    let tally = hook.tally();
    for i in (0..n).filter(|i| ![3, 7, 11].contains(i)) {
        assert_eq!(tally.get(&body(i, 0)), Some(&1), "message {i} once");
    }
    cleanup_keys(&mut r, &key).await;
}

/// An `https` endpoint that accepts TCP and never answers the TLS handshake: down (after
/// `connect_timeout`, not the request's `timeout`), `sink_up` 0 and `/readyz` 503 while it
/// lasts, and nothing dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_that_never_finishes_the_tls_handshake_is_down() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((tcp, _)) = listener.accept().await {
            held.push(tcp);
        }
    });
    never_connects_is_down(&format!("https://127.0.0.1:{port}/hook"), "tls").await;
    silent.abort();
}

/// A loopback endpoint whose accept queue is full: the kernel drops its SYNs, as a
/// firewall would. Down, as above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_that_drops_syns_is_down() {
    let socket = bound_socket();
    socket.listen(0).unwrap();
    let addr = socket.local_addr().unwrap().as_socket().unwrap();
    // Never accepted: connections fill the queue until a SYN goes unanswered.
    let mut queued = Vec::new();
    loop {
        let connect = tokio::net::TcpStream::connect(addr);
        match tokio::time::timeout(Duration::from_millis(300), connect).await {
            Ok(Ok(tcp)) if queued.len() < 16 => queued.push(tcp),
            Ok(r) => panic!("the accept queue never filled: {r:?}"),
            Err(_) => break,
        }
    }
    never_connects_is_down(&format!("http://{addr}/hook"), "syn").await;
    drop((socket, queued));
}

/// A TCP socket bound to a free loopback port, not listening yet.
fn bound_socket() -> socket2::Socket {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    let any_port: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
    socket.bind(&any_port.into()).unwrap();
    socket
}

/// Messages due for `url`, which never connects: the endpoint is down and stays so,
/// nothing is dead-lettered and no attempt counted.
async fn never_connects_is_down(url: &str, tag: &str) {
    let mut r = redis().await;
    let n = 20;
    let key = scheduled(&mut r, tag, n).await;
    let lines = format!("url = \"{url}\"\nmax_attempts = 1\n{FAST_RETRY}");
    let settings = [("timeout", "\"20s\""), ("connect_timeout", "\"500ms\"")];
    let bridge = http_bridge_with(&settings, &key, &lines);
    bridge
        .expect_readyz_saying(503, "unreachable", Duration::from_secs(10))
        .await;
    // Down for as long as it lasts (the probes too must connect): sampled over 4 s.
    for _ in 0..20 {
        let up = bridge
            .metric("delay_bridge_sink_up", &[("sink", "hooks")])
            .await;
        assert_eq!(up, 0.0, "sink_up while {url} never connects");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    expect_kept(&mut r, &key, n as i64).await;
    cleanup_keys(&mut r, &key).await;
}

/// With `follow_redirects`, 307 and 308 are followed with the same method and body; 301,
/// 302 and 303 are not (they would become a GET without the body), nor a 307 past the
/// last hop (a loop): nothing is deleted from Redis for them, nothing is dead-lettered, and
/// nothing arrives as a GET.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_redirects_that_keep_the_method_and_body_are_followed() {
    let mut r = redis().await;
    let hook = Webhook::start(|rq, _| match rq.path.strip_prefix("/from/") {
        Some("loop") => Answer::status(307).header("location", "/from/loop"),
        Some(code) => Answer::status(code.parse().unwrap()).header("location", "/to"),
        None => Answer::status(200),
    })
    .await;
    let port = free_port();
    let codes = [301, 302, 303, 307, 308];
    let keys: Vec<String> = codes.iter().map(|c| new_key(&format!("r{c}"))).collect();
    let mut config = ConfigToml::base(port)
        .without("sinks.rabbit")
        .http_sink("hooks", &[("follow_redirects", "3")])
        .to_string();
    for (code, key) in codes.iter().zip(&keys) {
        let method = if *code == 307 { "PUT" } else { "POST" };
        let lines = format!(
            "url = {}\nmethod = \"{method}\"\nmax_attempts = 1\n{FAST_RETRY}",
            quoted(&hook.url(&format!("/from/{code}")))
        );
        config += &trigger(&format!("t{code}"), key, "hooks", &lines);
    }
    let loop_key = new_key("rloop");
    let lines = format!(
        "url = {}\nmax_attempts = 1\n{FAST_RETRY}",
        quoted(&hook.url("/from/loop"))
    );
    config += &trigger("tloop", &loop_key, "hooks", &lines);
    let n = 5;
    for key in keys.iter().chain([&loop_key]) {
        schedule(&mut r, key, n, 0).await;
    }
    let bridge = Bridge::start(&config, port);
    for key in &keys[3..] {
        expect_settled(&mut r, key, 0, &bridge).await;
    }
    let to: Vec<Request> = hook
        .received()
        .into_iter()
        .filter(|rq| rq.path == "/to")
        .collect();
    assert_eq!(to.len(), 2 * n, "each 307 and 308 followed once: {to:?}");
    for (i, method) in [(0, "PUT"), (1, "POST")] {
        let from = format!("/from/{}", codes[3 + i]);
        let sent: Vec<Request> = hook
            .received()
            .into_iter()
            .filter(|rq| rq.path == from)
            .collect();
        for rq in &sent {
            let trigger = rq.header("x-delay-trigger");
            let followed: Vec<&Request> = to
                .iter()
                .filter(|t| t.body == rq.body && t.header("x-delay-trigger") == trigger)
                .collect();
            assert_eq!(followed.len(), 1, "{from}: followed once");
            assert_eq!(followed[0].method, method, "{from}: the same method");
            assert_eq!(followed[0].header("x-delay-id"), rq.header("x-delay-id"));
        }
    }
    // The others were asked, more than once, and never confirmed.
    let held: Vec<(String, &String)> = codes[..3]
        .iter()
        .map(|c| c.to_string())
        .chain(["loop".to_string()])
        .zip(keys.iter().take(3).chain([&loop_key]))
        .collect();
    let asked = wait_until(Duration::from_secs(15), || {
        held.iter().all(|(c, _)| {
            let from = format!("/from/{c}");
            // Two rounds: a loop is asked 1 + follow_redirects times a round.
            let round = if c == "loop" { 4 * n } else { n };
            hook.received().iter().filter(|rq| rq.path == from).count() >= 2 * round
        })
    })
    .await;
    assert!(asked, "{}", bridge.log());
    for (code, key) in &held {
        let (waiting, inflight, dead) = queue_sizes(&mut r, key).await;
        assert_eq!((waiting + inflight, dead), (n as i64, 0), "{code}");
    }
    assert!(
        hook.received().iter().all(|rq| rq.method != "GET"),
        "nothing sent as a GET"
    );
    for key in keys.iter().chain([&loop_key]) {
        cleanup_keys(&mut r, key).await;
    }
}

/// A URL corrected by a reload starts fresh: the old endpoint, down, no longer makes the
/// sink down once no route names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_corrects_the_url_makes_the_sink_up_again() {
    let mut r = redis().await;
    let hook = Webhook::ok().await;
    let n = 10;
    let key = scheduled(&mut r, "corrected", n).await;
    let port = free_port();
    // Bound, never listening: connections are refused, and no other test can take the port.
    let closed = bound_socket();
    let closed_port = closed.local_addr().unwrap().as_socket().unwrap().port();
    let wrong = format!("url = \"http://127.0.0.1:{closed_port}/\"\n{FAST_RETRY}");
    let bridge = Bridge::start(&http_config(port, &[], &key, &wrong), port);
    bridge
        .expect_readyz_saying(503, "unreachable", Duration::from_secs(20))
        .await;

    let right = hook_lines(&hook, FAST_RETRY);
    bridge.rewrite_config(&http_config(port, &[], &key, &right));
    bridge.signal(1);
    expect_settled(&mut r, &key, 0, &bridge).await;
    assert_eq!(hook.tally().len(), n);
    bridge.expect_readyz(200, Duration::from_secs(10)).await;
    let (up, last) = bridge
        .wait_scrape(Duration::from_secs(5), |body| {
            metric_value(body, "delay_bridge_sink_up", &[("sink", "hooks")]) == 1.0
        })
        .await;
    assert!(up, "sink_up 1 after the reload:\n{last}");
    drop(closed);
    cleanup_keys(&mut r, &key).await;
}
