//! Finding a message against real Redis by what an operator holds: its member, its id in
//! hash payload mode, or the id consumers were sent, scheduled, in flight or dead, anywhere
//! in a queue larger than one page.

use crate::common;

use std::time::Duration;

use common::*;
use delay_bridge::parts::redis::store::{FoundBy, IdScheme, Place};
use delay_bridge::wire::MessageId;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_is_found_by_member_or_consumer_id_wherever_it_is() {
    let mut r = redis().await;
    let key = format!("{}:{{find}}", unique("find"));
    let scheme = IdScheme {
        trigger_key: &key,
        envelope: false,
    };
    let now = redis_now(&mut r).await;
    // 2,500 scheduled later, past any first page; two due now, claimed; one dead.
    schedule_crowd(&mut r, &key, "later", 2500, now + 3_600_000).await;
    zadd_all(&mut r, &key, [(now - 1000, "due-a"), (now - 1000, "due-b")]).await;
    let s = store(&key).await;
    let claimed = s.claim(10, Duration::from_secs(300)).await.unwrap();
    assert_eq!(claimed.items.len(), 2);
    dead_letter(
        &mut r,
        &key,
        "gone",
        now,
        r#"{"reason":"nack","attempts":1}"#,
    )
    .await;

    // By member.
    let hit = s.lookup(scheme, b"later-2400").await.unwrap().unwrap();
    assert_eq!(
        (hit.member.as_slice(), hit.by),
        (&b"later-2400"[..], FoundBy::Member)
    );

    // By consumer id: the digest of the trigger's key and the member, in each place.
    for (member, place) in [
        ("later-2499", "scheduled"),
        ("due-b", "in_flight"),
        ("gone", "dead"),
    ] {
        let id = MessageId::new(&key, member.as_bytes()).as_str().to_string();
        assert_eq!(scheme.consumer_id(member.as_bytes(), None), id);
        let hit = s.lookup(scheme, id.as_bytes()).await.unwrap();
        let hit = hit.unwrap_or_else(|| panic!("{member} by {id}"));
        assert_eq!(hit.member, member.as_bytes(), "{id}");
        assert_eq!(hit.by, FoundBy::ConsumerId);
        let state = match &hit.found.places[0] {
            Place::Scheduled { .. } => "scheduled",
            Place::InFlight { .. } => "in_flight",
            Place::Dead { .. } => "dead",
        };
        assert_eq!(state, place, "{member}");
    }
    // The digest of a member of another key, or no digest at all, finds nothing.
    let other = MessageId::new("elsewhere", b"later-0001")
        .as_str()
        .to_string();
    assert!(s.lookup(scheme, other.as_bytes()).await.unwrap().is_none());
    assert!(s.lookup(scheme, b"\xffnope").await.unwrap().is_none());
    cleanup_keys(&mut r, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_envelope_id_finds_its_message_inline_and_in_hash_mode() {
    let mut r = redis().await;
    let now = redis_now(&mut r).await;
    // Inline: the member is the envelope.
    let key = format!("{}:{{find}}", unique("find-env"));
    let scheme = IdScheme {
        trigger_key: &key,
        envelope: true,
    };
    let member = r#"{"body":"hello","id":"order-77"}"#;
    zadd_all(
        &mut r,
        &key,
        (0..1200)
            .map(|i| (now + 60_000, format!(r#"{{"body":"x","id":"filler-{i}"}}"#)))
            .chain([(now + 90_000, member.to_string())]),
    )
    .await;
    let inline = store(&key).await;
    let hit = inline.lookup(scheme, b"order-77").await.unwrap().unwrap();
    assert_eq!(
        (hit.member.as_slice(), hit.by),
        (member.as_bytes(), FoundBy::EnvelopeId)
    );
    assert_eq!(
        scheme.consumer_id(member.as_bytes(), Some(member.as_bytes())),
        "order-77"
    );
    cleanup_keys(&mut r, &key).await;

    // Hash payload mode: the envelope is the body of the id.
    let key = format!("{}:{{find}}", unique("find-hash"));
    let scheme = IdScheme {
        trigger_key: &key,
        envelope: true,
    };
    let hashed = store(&key).await.with_hash_bodies(1 << 20);
    hashed
        .schedule_by_id(
            b"id-1",
            br#"{"body":"b","id":"sent-as-this"}"#,
            now + 60_000,
        )
        .await
        .unwrap();
    hashed
        .schedule_by_id(b"id-2", br#"{"body":"b"}"#, now + 60_000)
        .await
        .unwrap();
    let hit = hashed
        .lookup(scheme, b"sent-as-this")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (hit.member.as_slice(), hit.by),
        (&b"id-1"[..], FoundBy::EnvelopeId)
    );
    assert_eq!(
        hit.found.body.as_deref(),
        Some(&br#"{"body":"b","id":"sent-as-this"}"#[..])
    );
    // Without an envelope id, the digest is the consumer id.
    let id = MessageId::new(&key, b"id-2").as_str().to_string();
    let hit = hashed.lookup(scheme, id.as_bytes()).await.unwrap().unwrap();
    assert_eq!(
        (hit.member.as_slice(), hit.by),
        (&b"id-2"[..], FoundBy::ConsumerId)
    );
    cleanup_keys(&mut r, &key).await;
}
