//! A sharded trigger through the admin API: one queue, whatever shard holds a member.

use super::*;

/// A trigger of 4 shards through the admin API: the list sums the shards, browsing pages
/// through all of them in due order (ties by member) without skipping or repeating, a member
/// is found and cancelled on whichever shard holds it, and pause holds every shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_serves_a_sharded_trigger_as_one_queue() {
    const SHARDS: u32 = 4;
    let (mut r, capture, key) = amqp_scene("admin-shards", "sharded", "admin").await;
    let (port, admin_port) = (free_port(), free_port());
    let trigger = format!("shards = {SHARDS}");
    let config = admin_config_with(port, admin_port, &key, &capture, "", &trigger);
    let (bridge, mut api) = start_with_api(&config, port, admin_port).await;
    // 30 members far ahead, spread by the shard hash, with ties in due time.
    let later = now_ms() + 3_600_000;
    let mut expected: Vec<(i64, String)> = Vec::new();
    for i in 0..30 {
        let member = format!("m-{i:02}");
        let due = later + (i % 7) as i64;
        let shard = shard_key(&key, shard_of(member.as_bytes(), SHARDS), SHARDS).unwrap();
        zadd(&mut r, &shard, due, &member).await;
        expected.push((due, member));
    }
    expected.sort();
    let used: BTreeSet<u32> = expected
        .iter()
        .map(|(_, m)| shard_of(m.as_bytes(), SHARDS))
        .collect();
    assert_eq!(used.len(), SHARDS as usize, "every shard holds some");

    let list = api.get(TRIGGERS, "", "").await.json();
    assert_eq!(list["triggers"][0]["stats"]["scheduled"], 30, "{list}");
    let mut seen = Vec::new();
    let mut after = String::new();
    loop {
        let page = api.get(SCHEDULED, "api", &format!("?limit=7{after}")).await;
        assert_eq!(page.status, 200, "{}", page.body);
        let p = page.json();
        for item in p["items"].as_array().unwrap() {
            seen.push((
                item["due_ms"].as_i64().unwrap(),
                item["member"].as_str().unwrap().to_string(),
            ));
        }
        match p["next"].as_str() {
            Some(next) => after = format!("&after={next}"),
            None => break,
        }
    }
    assert_eq!(
        seen, expected,
        "every member once, in due order, ties by member"
    );

    let found = api.get(MESSAGE, "api", "m-13").await;
    assert_eq!(found.status, 200, "{}", found.body);
    let cancelled = api
        .post(
            CANCEL,
            "api",
            json!({"members": ["m-13", "m-22", "nobody"]}),
        )
        .await;
    assert_eq!(cancelled.json(), json!({"cancelled": 2}));
    let paused = api.post(PAUSE, "api", json!({})).await;
    assert_eq!(paused.status, 200, "{}", paused.body);
    for i in 0..SHARDS {
        let keys = QueueKeys::derive(&shard_key(&key, i, SHARDS).unwrap()).unwrap();
        let flag: Option<String> = hget(&mut r, &keys.control, "paused").await;
        assert!(flag.is_some(), "shard {i} paused");
        cleanup_keys(&mut r, &keys.source).await;
    }
    bridge.assert_no_panic();
}
