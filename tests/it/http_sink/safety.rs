//! What the HTTP sink refuses to call, how receivers know the bridge sent a request, and TLS
//! with the test CA.

use crate::common;

use std::path::PathBuf;
use std::time::Duration;

use common::tls::{Pki, ServerCert};
use common::webhook::*;
use common::*;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::{
    expect_settled, http_bridge, http_bridge_with, http_config, new_key, scheduled, FAST_RETRY,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_urls_refuses_the_urls_it_does_not_list() {
    let mut r = redis().await;
    let hook = Webhook::ok().await;
    let key = new_key("urls");
    let envelope = |body: &str, url: Option<String>| {
        let mut e = serde_json::json!({
            "body": body,
            "headers": {"x-tenant": "acme"},
            "content_type": "application/json",
        });
        if let Some(url) = url {
            e["url"] = url.into();
        }
        e.to_string()
    };
    let messages = [
        envelope("to-default", None),
        envelope("to-allowed", Some(hook.url("/allowed/7"))),
        envelope("to-other", Some(hook.url("/other"))),
        envelope("to-prefix", Some(hook.url("/allowed-not"))),
        envelope("to-metadata", Some("http://169.254.169.254/latest".into())),
    ];
    schedule_now(&mut r, &key, messages.iter()).await;
    let lines = format!(
        "url = {}\nformat = \"envelope\"\nallowed_urls = [{}]\n{FAST_RETRY}",
        quoted(&hook.url("/default")),
        quoted(&hook.url("/allowed"))
    );
    let bridge = http_bridge(&key, &lines);
    expect_settled(&mut r, &key, 3, &bridge).await;
    for refused in &messages[2..] {
        let why = dead_reason(&mut r, &key, refused).await.unwrap();
        assert_eq!(why["reason"], "url_not_allowed", "{why}");
    }
    let mut got: Vec<(String, Vec<u8>)> = hook
        .received()
        .into_iter()
        .map(|rq| {
            assert_eq!(rq.header("x-tenant"), "acme");
            assert_eq!(rq.header("content-type"), "application/json");
            (rq.path, rq.body)
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            ("/allowed/7".to_string(), b"to-allowed".to_vec()),
            ("/default".to_string(), b"to-default".to_vec())
        ]
    );
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn link_local_and_metadata_addresses_are_refused() {
    let mut r = redis().await;
    let key = new_key("meta");
    schedule_now(&mut r, &key, ["a", "b"]).await;
    let lines = "url = \"http://169.254.169.254/latest/meta-data\"";
    let bridge = http_bridge_with(&[], &key, lines);
    expect_settled(&mut r, &key, 2, &bridge).await;
    let why = dead_reason(&mut r, &key, "a").await.unwrap();
    assert_eq!(why["reason"], "address_not_allowed", "{why}");
    assert!(why["detail"].as_str().unwrap().contains("169.254.169.254"));
    cleanup_keys(&mut r, &key).await;
}

/// What a receiver does with `x-delay-signature` (docs/http.md): the HMAC of `t.body` under
/// the shared secret, and a time within the replay window.
fn verify(secret: &[u8], rq: &Request) -> bool {
    let header = rq.header("x-delay-signature");
    let Some((t, v1)) = header
        .split_once(',')
        .and_then(|(t, v)| Some((t.strip_prefix("t=")?, v.strip_prefix("v1=")?)))
    else {
        return false;
    };
    let Ok(t_ms) = t.parse::<i64>() else {
        return false;
    };
    if (now_ms() - t_ms).abs() > 5 * 60 * 1000 {
        return false;
    }
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).unwrap();
    mac.update(t.as_bytes());
    mac.update(b".");
    mac.update(&rq.body);
    let Ok(given) = hex::decode(v1) else {
        return false;
    };
    mac.verify_slice(&given).is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_test_server_verifies_the_signature() {
    const SECRET: &str = "5f2c8e0e1d7a4b39a6c1f0e2d3b4a596";
    let mut r = redis().await;
    let hook = Webhook::start(|rq, _| match verify(SECRET.as_bytes(), rq) {
        true => Answer::status(204),
        false => Answer::status(401).body("bad signature"),
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("hook-key");
    std::fs::write(&secret_file, format!("{SECRET}\n")).unwrap();
    let n = 10;
    let key = scheduled(&mut r, "signed", n).await;
    let settings = [("signing_secret_file", quoted(secret_file.to_str().unwrap()))];
    let settings: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let lines = format!("url = {}", quoted(&hook.url("/")));
    let bridge = http_bridge_with(&settings, &key, &lines);
    expect_settled(&mut r, &key, 0, &bridge).await;
    assert_eq!(hook.count(), n, "each verified at once");
    // A wrong secret would be refused: the check is not vacuous.
    assert!(!verify(
        b"another secret of 32 bytes......",
        &hook.received()[0]
    ));
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_with_the_test_ca_and_http2() {
    let mut r = redis().await;
    let pki = Pki::new();
    let (cert, key_file) = pki.server(ServerCert::Loopback);
    let hook = Webhook::start_tls(&cert, &key_file, |_, _| Answer::status(200)).await;
    let n = 5;
    let key = scheduled(&mut r, "tls", n).await;
    let port = free_port();
    // A config whose sink trusts the authority `ca` signed.
    let cfg = |ca: PathBuf| {
        ConfigToml::base(port)
            .without("sinks.rabbit")
            .http_sink("hooks", &[])
            .set_str("sinks.hooks.tls", "ca_file", ca.to_str().unwrap())
            .to_string()
            + &trigger(
                "hooks",
                &key,
                "hooks",
                &format!("url = {}", quoted(&hook.url("/tls"))),
            )
    };
    let bridge = Bridge::start(&cfg(pki.ca()), port);
    expect_settled(&mut r, &key, 0, &bridge).await;
    assert_eq!(hook.tally().len(), n);
    for rq in hook.received() {
        assert_eq!(
            rq.version,
            axum::http::Version::HTTP_2,
            "HTTP/2 when offered"
        );
    }
    drop(bridge);

    // An endpoint whose certificate the sink does not trust is unreachable, not the
    // messages' fault: they wait in Redis, and readiness says why.
    schedule_now(&mut r, &key, ["untrusted"]).await;
    let bridge = Bridge::start(&cfg(pki.other_ca()), port);
    bridge
        .expect_readyz_saying(503, "unreachable", Duration::from_secs(20))
        .await;
    let (waiting, inflight, dead) = queue_sizes(&mut r, &key).await;
    assert_eq!((waiting + inflight, dead), (1, 0));
    assert_eq!(hook.tally().len(), n, "nothing reached the endpoint");
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_pointer_takes_each_url_from_the_body_within_allowed_urls() {
    let mut r = redis().await;
    let hook = Webhook::ok().await;
    let key = new_key("pointer");
    let to = |url: &str| serde_json::json!({ "target": url }).to_string();
    let allowed = to(&hook.url("/p/1"));
    let refused = to("http://127.0.0.1:1/x");
    let missing = r#"{"no":"target"}"#.to_string();
    schedule_now(&mut r, &key, [&allowed, &refused, &missing]).await;
    let lines = format!(
        "url_pointer = \"/target\"\nallowed_urls = [{}]\n{FAST_RETRY}",
        quoted(&hook.url("/p"))
    );
    let bridge = http_bridge(&key, &lines);
    expect_settled(&mut r, &key, 2, &bridge).await;
    let reason = |why: Option<serde_json::Value>| why.unwrap()["reason"].clone();
    assert_eq!(
        reason(dead_reason(&mut r, &key, &refused).await),
        "url_not_allowed"
    );
    assert_eq!(
        reason(dead_reason(&mut r, &key, &missing).await),
        "bad_payload"
    );
    let received = hook.received();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].path, "/p/1");
    assert_eq!(received[0].body, allowed.as_bytes());
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_are_followed_only_as_configured() {
    let mut r = redis().await;
    let hook = Webhook::start(|rq, _| match rq.path.as_str() {
        "/old" => Answer::status(307).header("location", "/new"),
        "/metadata" => Answer::status(307).header("location", "http://169.254.169.254/latest"),
        _ => Answer::status(200),
    })
    .await;
    let (unfollowed, followed) = (new_key("no-redirect"), new_key("redirect"));
    let to_metadata = new_key("redirect-metadata");
    for key in [&unfollowed, &followed, &to_metadata] {
        schedule_now(&mut r, key, ["m"]).await;
    }
    let port = free_port();
    let cfg = |key: &str, path: &str, hops: &str| {
        http_config(
            port,
            &[("follow_redirects", hops)],
            key,
            &format!("url = {}\n{FAST_RETRY}", quoted(&hook.url(path))),
        )
    };
    // Not followed: the endpoint moved, its failure; the message waits in Redis.
    let bridge = Bridge::start(&cfg(&unfollowed, "/old", "0"), port);
    let on_old = || {
        hook.received()
            .iter()
            .filter(|rq| rq.path == "/old")
            .count()
    };
    assert!(
        wait_until(Duration::from_secs(10), || on_old() >= 2).await,
        "{}",
        bridge.log()
    );
    let (waiting, inflight, dead) = queue_sizes(&mut r, &unfollowed).await;
    assert_eq!(
        (waiting + inflight, dead),
        (1, 0),
        "held, not dead-lettered"
    );
    assert!(!hook.received().iter().any(|rq| rq.path == "/new"));
    drop(bridge);

    let bridge = Bridge::start(&cfg(&followed, "/old", "1"), port);
    expect_settled(&mut r, &followed, 0, &bridge).await;
    assert!(hook.received().iter().any(|rq| rq.path == "/new"));
    drop(bridge);

    let bridge = Bridge::start(&cfg(&to_metadata, "/metadata", "1"), port);
    expect_settled(&mut r, &to_metadata, 1, &bridge).await;
    let why = dead_reason(&mut r, &to_metadata, "m").await.unwrap();
    assert_eq!(why["reason"], "address_not_allowed", "{why}");
    for key in [&unfollowed, &followed, &to_metadata] {
        cleanup_keys(&mut r, key).await;
    }
}
