//! Produce errors the mock broker injects: transient ones retried, a permanent one
//! dead-lettered, a fatal idempotence error, a full producer queue; nothing lost.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_produce_errors_are_retried_without_loss() {
    let (mut r, case) = Case::open("transient").await;
    // librdkafka gives up on a record after 1.5 s of failed attempts; the bridge then retries
    // it itself, so both layers of retry are exercised.
    let (capture, bridge) = case
        .start(
            &[("message.timeout.ms", "1500")],
            "workers = 2\nbatch = 10\nmax_attempts = 100\npublish_timeout = \"5s\"\n\
             backoff_initial = \"100ms\"\nbackoff_max = \"200ms\"",
        )
        .await;

    let errors: Vec<RDKafkaRespErr> = (0..40)
        .map(|i| match i % 3 {
            0 => RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
            1 => RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
            _ => RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
        })
        .collect();
    case.mock.request_errors(RDKafkaApiKey::Produce, &errors);
    let expected = members("t", 200);
    schedule_now(&mut r, &case.key, &expected).await;

    let end = wait_for(&mut r, &case.key, (0, 0, 0), Duration::from_secs(90)).await;
    assert_eq!(
        end,
        (0, 0, 0),
        "everything forwarded, nothing dead-lettered"
    );
    // The cluster's errors count no attempt against the messages: they went back unattempted.
    let retried = bridge.retried("transient", "kafka_message_timed_out");
    assert_eq!(retried, 0, "the cluster's failure costs no attempt");
    bridge
        .expect_forwarded("transient", expected.len(), Duration::from_secs(5))
        .await;
    let duplicates = stop_and_tally(bridge, &capture, &expected).await;
    let late_attempts = capture
        .snapshot()
        .iter()
        .filter(|m| m.attempt() > Some(1))
        .count();
    println!(
        "transient errors: {} messages, 40 produce errors, lost 0, bridge retries {retried}, \
         records with attempt > 1: {late_attempts}, duplicates {duplicates}",
        expected.len()
    );
    cleanup_keys(&mut r, &case.key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_error_dead_letters_with_its_reason_and_the_producer_goes_on() {
    let (mut r, case) = Case::open("permanent").await;
    let (capture, bridge) = case
        .start(
            &[],
            "workers = 1\nbatch = 1\nmax_attempts = 2\nbackoff_initial = \"100ms\"",
        )
        .await;

    // The broker rejects the record as too large, on each of its attempts: the message's own
    // fault, counted, then dead-lettered.
    case.mock.request_errors(
        RDKafkaApiKey::Produce,
        &[
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE,
        ],
    );
    schedule_now(&mut r, &case.key, &["victim".to_string()]).await;
    assert_eq!(
        wait_for(&mut r, &case.key, (0, 0, 1), Duration::from_secs(20)).await,
        (0, 0, 1)
    );
    let reason = dead_reason(&mut r, &case.key, "victim").await.unwrap();
    assert_eq!(reason["reason"], "kafka_message_size_too_large");
    assert_eq!(reason["attempts"], 2, "dead-lettered after max_attempts");
    assert_eq!(
        bridge
            .metrics
            .triggers
            .cells("permanent", SINK)
            .dead_lettered
            .get("kafka_message_size_too_large"),
        1
    );

    // The idempotent producer bumps its epoch and carries on with the next messages.
    let expected = members("after", 20);
    schedule_now(&mut r, &case.key, &expected).await;
    assert_eq!(
        wait_for(&mut r, &case.key, (0, 0, 1), Duration::from_secs(20)).await,
        (0, 0, 1)
    );
    bridge
        .expect_forwarded("permanent", 20, Duration::from_secs(10))
        .await;
    finish_without_duplicates(bridge, &capture, &expected, &mut r, &case.key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fatal_idempotence_error_replaces_the_producer_without_loss() {
    let (mut r, case) = Case::open("fatal").await;
    let (capture, bridge) = case
        .start(&[], "workers = 2\nbatch = 10\nmax_attempts = 2")
        .await;

    // A sequence error on the head-of-line request is fatal for an idempotent producer: from
    // then on it refuses every record. Without a new producer the queue would stall (or, with
    // retries counted, be dead-lettered).
    case.mock.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER],
    );
    let expected = members("f", 100);
    schedule_now(&mut r, &case.key, &expected).await;
    let end = wait_for(&mut r, &case.key, (0, 0, 0), Duration::from_secs(30)).await;
    assert_eq!(end, (0, 0, 0), "delivered after the producer was replaced");
    let put_back = put_back_of(&bridge, "fatal");
    assert!(put_back > 0, "the fatal error hit a batch, which went back");
    let duplicates = stop_and_tally(bridge, &capture, &expected).await;
    let retried: usize = capture
        .snapshot()
        .iter()
        .filter(|m| m.attempt() != Some(1))
        .count();
    println!(
        "fatal error: {} messages, lost 0, duplicates {duplicates}, put back {put_back}, \
         attempt > 1: {retried}",
        expected.len()
    );
    assert_eq!(
        retried, 0,
        "the producer failed, not the messages: no attempt counted"
    );
    cleanup_keys(&mut r, &case.key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_producer_queue_waits_for_room_and_loses_nothing() {
    let (mut r, case) = Case::open("queuefull").await;
    // Slow acknowledgements keep records queued, so batches run into the queue limit.
    case.mock
        .broker_round_trip_time(-1, Duration::from_millis(50))
        .unwrap();
    // Timeouts far beyond the test's length: a duplicate could then only come from the queue
    // handling itself.
    let properties = [
        ("queue.buffering.max.messages", "8"),
        ("message.timeout.ms", "120000"),
    ];
    let (capture, bridge) = case
        .start(
            &properties,
            "workers = 3\nbatch = 50\npublish_timeout = \"120s\"\nlease = \"240s\"",
        )
        .await;
    let expected = members("q", 600);
    schedule_now(&mut r, &case.key, &expected).await;
    let end = wait_for(&mut r, &case.key, (0, 0, 0), Duration::from_secs(60)).await;
    assert_eq!(end, (0, 0, 0));
    bridge
        .expect_forwarded("queuefull", expected.len(), Duration::from_secs(5))
        .await;
    finish_without_duplicates(bridge, &capture, &expected, &mut r, &case.key).await;
}
