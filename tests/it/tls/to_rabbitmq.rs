//! RabbitMQ over TLS: the client certificate it demands, then every message delivered.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_over_tls_needs_the_client_certificate_then_delivers_everything() {
    let n = 300;
    let pki = Pki::new();
    let rabbit = RabbitServer::start_tls(&pki).await;
    // The test's own consumer uses the node's plain listener.
    let tally = Tally::start(&rabbit.url()).await;
    let mut r = redis().await;
    let key = unique("tls-amqp");
    schedule(&mut r, &key, n, 0).await;
    let to = format!(
        "exchange = \"{}\"\nrouting_key = \"{}\"\n",
        tally.exchange, tally.routing_key
    );
    let trigger = trigger("tls", &key, "rabbit", &(to + "workers = 2\nbatch = 50"));
    let sink = |port| ConfigToml::base(port).set_str("sinks.rabbit", "url", &rabbit.tls_url());

    // The CA but no client certificate: the node refuses the handshake.
    let port = free_port();
    let config = with_tls(sink(port), "sinks.rabbit", &[("ca_file", &pki.ca())]);
    let mut bridge = Bridge::start(&(config.to_string() + &trigger), port);
    let endpoint = format!("127.0.0.1:{}", rabbit.tls_port());
    let (said, log) = wait_log(&mut bridge, REFUSAL, &[&endpoint, "tls"], PEER_REFUSED).await;
    assert!(
        said,
        "a log line should name {endpoint}, TLS and one of {PEER_REFUSED:?}:\n{log}"
    );
    bridge.expect_readyz(503, Duration::from_secs(5)).await;
    let queued = assert_not_claiming(&mut r, &key, Duration::from_secs(2), &bridge).await;
    assert_eq!(queued, n as i64, "every member stays in Redis");
    bridge.assert_alive();
    drop(bridge);

    let port = free_port();
    let config = with_tls(
        sink(port),
        "sinks.rabbit",
        &[
            ("ca_file", &pki.ca()),
            ("cert_file", &pki.client_cert()),
            ("key_file", &pki.client_key()),
        ],
    );
    let mut bridge = start_ready(&config, &trigger, port).await;
    tally
        .expect_distinct(n, Duration::from_secs(60), &bridge)
        .await;
    assert_eq!(
        wait_drained(&mut r, &key, Duration::from_secs(10)).await,
        (0, 0, 0),
        "confirmed members leave Redis"
    );
    report("amqps_client_certificate", n, 0, &tally, "");
    bridge.terminate(Duration::from_secs(15)).await;
    bridge.assert_no_panic();
    cleanup_keys(&mut r, &key).await;
    tally.cleanup().await;
}
