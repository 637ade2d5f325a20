//! The mock broker down: nothing claimed meanwhile, forwarding resumed after, and a shutdown
//! during the outage putting claimed messages back.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_down_stops_claiming_and_recovery_resumes_forwarding() {
    let (mut r, case) = Case::open("outage").await;
    let (capture, bridge) = case
        .start(&[], "workers = 3\nbatch = 20\nguard_interval = \"200ms\"")
        .await;
    let first = members("before", 10);
    schedule_now(&mut r, &case.key, &first).await;
    bridge
        .expect_forwarded("outage", 10, Duration::from_secs(15))
        .await;

    case.mock.broker_down(-1).unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || !bridge.sink_up()).await,
        "the sink noticed the outage"
    );
    let claims = bridge.claims("outage");
    let during = members("during", 50);
    schedule_now(&mut r, &case.key, &during).await;
    // Watch for a while: nothing may be claimed while no broker is up.
    let watch_until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < watch_until {
        let (source, inflight, dead) = queue_sizes(&mut r, &case.key).await;
        assert_eq!(
            (source, inflight, dead),
            (50, 0, 0),
            "members stay in the source set during the outage"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        bridge.claims("outage"),
        claims,
        "no member claimed while the broker is down"
    );

    case.mock.broker_up(-1).unwrap();
    let end = wait_for(&mut r, &case.key, (0, 0, 0), Duration::from_secs(30)).await;
    assert_eq!(end, (0, 0, 0), "forwarding resumed");
    bridge
        .expect_forwarded("outage", 60, Duration::from_secs(5))
        .await;
    let mut all = first.clone();
    all.extend(during);
    finish_without_duplicates(bridge, &capture, &all, &mut r, &case.key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_during_an_outage_puts_claimed_messages_back() {
    let (mut r, case) = Case::open("shutdown").await;
    let toml = case.config(
        &[("message.timeout.ms", "30000")],
        "workers = 2\nbatch = 25\npublish_timeout = \"30s\"\nlease = \"60s\"",
    );
    let bridge = InProcess::start(&toml).up().await;

    // Acknowledgements take longer than the test: claimed batches wait on their records ...
    case.mock
        .broker_round_trip_time(-1, Duration::from_secs(60))
        .unwrap();
    let expected = members("s", 100);
    schedule_now(&mut r, &case.key, &expected).await;
    // Each worker keeps several batches in flight: all 100 members end up claimed.
    let (_, claimed) = poll(
        Duration::from_secs(4),
        Duration::from_millis(20),
        async || queue_sizes(&mut r, &case.key).await,
        |s| s.1 == 100,
    )
    .await;
    assert_eq!(claimed, (0, 100, 0), "four batches in flight");
    // ... when the broker goes away altogether.
    case.mock.broker_down(-1).unwrap();
    assert!(wait_until(Duration::from_secs(10), || !bridge.sink_up()).await);

    let cells = bridge
        .metrics
        .triggers
        .find("shutdown")
        .expect("the trigger's series");
    let took = bridge.stop(Duration::from_secs(4 + 3)).await;
    println!("shutdown during an outage took {took:?} (shutdown.timeout 4s)");
    assert_eq!(
        queue_sizes(&mut r, &case.key).await,
        (100, 0, 0),
        "in-flight set empty, every member back in the source set"
    );
    assert_eq!(cells.put_back.load(Ordering::Relaxed), 100);
    let keys = delay_bridge::keys::QueueKeys::derive(&case.key).unwrap();
    assert_eq!(
        hlen(&mut r, &keys.attempts).await,
        0,
        "put back unattempted"
    );

    // The same queue drains once a broker is back.
    case.mock
        .broker_round_trip_time(-1, Duration::ZERO)
        .unwrap();
    case.mock.broker_up(-1).unwrap();
    let capture = case.capture();
    let bridge = InProcess::start(&toml);
    let end = wait_for(&mut r, &case.key, (0, 0, 0), Duration::from_secs(30)).await;
    assert_eq!(end, (0, 0, 0));
    let duplicates = stop_and_tally(bridge, &capture, &expected).await;
    println!(
        "after the outage: {} messages, lost 0, duplicates {duplicates}",
        expected.len()
    );
    cleanup_keys(&mut r, &case.key).await;
}
