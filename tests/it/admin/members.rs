//! Members that are not UTF-8 and infinite scores through the admin API, and one message
//! found by the id its consumers see, over a queue larger than any page.

use super::*;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use delay_bridge::wire::MessageId;

/// The id consumers are sent for `member` of the trigger keyed `key`.
fn consumer_id(key: &str, member: &[u8]) -> String {
    MessageId::new(key, member).as_str().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_carries_binary_members_as_base64_infinite_scores_as_words_and_finds_consumer_ids()
{
    let (mut r, capture, key) = amqp_scene("admin-members", "api", "admin-members").await;
    let keys = QueueKeys::derive(&key).unwrap();
    let binary: &[u8] = b"bin-\xff\xfe";
    let b64 = STANDARD.encode(binary);
    // Paused: the member due at -inf ("now") stays to be read.
    hset(&mut r, &keys.control, "paused", 1).await;
    zadd(&mut r, &key, "-inf", "now-member").await;
    zadd(&mut r, &key, "+inf", "parked-member").await;
    zadd(&mut r, &key, "+inf", binary).await;
    let now = redis_now(&mut r).await;
    // 1,500 ahead of the one looked for: it is past the first 1,000 in due order.
    schedule_crowd(&mut r, &key, "fill", 1500, now + 600_000).await;
    zadd(&mut r, &key, now + 7_200_000, "deep-target").await;
    let huge = "h".repeat(1_200_000);
    dead_letter(
        &mut r,
        &key,
        &huge,
        now,
        r#"{"reason":"too_large","attempts":0}"#,
    )
    .await;
    zadd(&mut r, &keys.dead, now - 1, binary).await;
    let nack = r#"{"reason":"nack","attempts":2}"#;
    hset(&mut r, &keys.dead_reasons, binary, nack).await;
    let (port, admin_port) = (free_port(), free_port());
    let config = admin_config(port, admin_port, &key, &capture, "");
    let (bridge, mut api) = start_with_api(&config, port, admin_port).await;

    // Infinite scores are words, and the binary member comes with its base64.
    let page = api.get(SCHEDULED, "api", "?limit=3").await.json();
    let items = page["items"].as_array().unwrap();
    assert_eq!(items[0]["member"], "now-member");
    assert_eq!(items[0]["due_ms"], Value::Null);
    assert_eq!(items[0]["due"], "now");
    assert_eq!(items[0]["id"], consumer_id(&key, b"now-member"));
    let tail = api
        .get(SCHEDULED, "api", &format!("?from_ms={}", now + 7_000_000))
        .await
        .json();
    let tail: Vec<&Value> = tail["items"].as_array().unwrap().iter().collect();
    let bin = tail
        .iter()
        .find(|e| e.get("member_b64").is_some())
        .expect("the binary member");
    assert_eq!(bin["member_b64"], b64.as_str());
    assert_eq!(bin["due"], "parked");
    assert!(
        tail.iter()
            .all(|e| e["due_ms"].is_null() == e.get("due").is_some()),
        "{tail:?}"
    );

    // One message by member, by base64, and by the id consumers see, past the first 1,000.
    let by_id = api
        .get(MESSAGE, "api", &consumer_id(&key, b"deep-target"))
        .await;
    assert_eq!(by_id.status, 200, "{}", by_id.body);
    let m = by_id.json();
    assert_eq!(m["member"], "deep-target");
    assert_eq!(m["found_by"], "consumer_id");
    assert_eq!(m["places"][0]["state"], "scheduled");
    assert_eq!(m["places"][0]["due_ms"], now + 7_200_000);
    let by_b64 = api
        .get(
            MESSAGE,
            "api",
            &format!(
                "{}?encoding=base64",
                b64.replace('/', "%2F").replace('+', "%2B")
            ),
        )
        .await
        .json();
    assert_eq!(by_b64["member_b64"], b64.as_str());
    assert_eq!(by_b64["id"], consumer_id(&key, binary));
    let states: Vec<&str> = by_b64["places"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["scheduled", "dead"]);
    let nowhere = api.get(MESSAGE, "api", "0123456789abcdef").await;
    assert_eq!(nowhere.status, 404);
    let bad = api.get(MESSAGE, "api", "%25%25?encoding=base64").await;
    assert_eq!(bad.status, 400, "{}", bad.body);

    // A too_large dead letter has a detail; the binary one (first: the page ends after the
    // 1.2 MB one) its base64.
    let dead = api.get(DEAD, "api", "").await.json();
    let dead = dead["items"].as_array().unwrap();
    let large = dead
        .iter()
        .find(|d| d["reason"]["reason"] == "too_large")
        .unwrap();
    assert!(
        large["detail"]
            .as_str()
            .unwrap()
            .starts_with("1200000 bytes"),
        "{}",
        large["detail"]
    );
    assert!(dead.iter().any(|d| d["member_b64"] == b64.as_str()));

    // Actions name it by base64, and count what they did.
    let promoted = api
        .post(PROMOTE, "api", json!({"members_b64": [b64]}))
        .await;
    assert_eq!(promoted.json(), json!({"changed": 1}), "{}", promoted.body);
    let score: Option<f64> = redis::cmd("ZSCORE")
        .arg(&key)
        .arg(binary)
        .query_async(&mut r)
        .await
        .unwrap();
    let now = redis_now(&mut r).await as f64;
    assert!(score.is_some_and(|s| s <= now + 1.0), "{score:?}");
    let refused = api
        .post(PROMOTE, "api", json!({"members_b64": ["%%"]}))
        .await;
    assert_eq!(refused.status, 400);
    let cancelled = api.post(CANCEL, "api", json!({"members_b64": [b64]})).await;
    assert_eq!(cancelled.json(), json!({"cancelled": 1}));
    let purged = api
        .post(PURGE, "api", json!({"what": "scheduled", "confirm": true}))
        .await;
    assert_eq!(purged.status, 200);

    // Resumed, the binary dead letter requeued by base64 arrives with the id the list gave.
    let listed = api.get(DEAD, "api", "").await.json();
    let id = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["member_b64"] == b64.as_str())
        .unwrap()["id"]
        .clone();
    let requeued = api
        .post(REQUEUE, "api", json!({"members_b64": [b64]}))
        .await;
    assert_eq!(requeued.json(), json!({"requeued": 1}));
    api.post(RESUME, "api", json!({})).await;
    bridge
        .expect_arrivals(1, WAIT_ARRIVAL, || capture.count())
        .await;
    let got = capture.snapshot();
    assert_eq!(got[0].body, binary);
    assert_eq!(
        got[0].message_id.as_deref(),
        id.as_str(),
        "the id consumers see"
    );
    bridge.assert_no_panic();
    cleanup_keys(&mut r, &key).await;
}

const WAIT_ARRIVAL: Duration = Duration::from_secs(15);
