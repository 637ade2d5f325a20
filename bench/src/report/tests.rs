//! The report's rows and verdicts, on hand-made figures.

use super::*;

fn amqp_report(forward: f64) -> Report {
    Report {
        settings: Settings {
            sink: "amqp".into(),
            ..Settings::default()
        },
        broker_ceiling: Some(Rate::new(1000, 1.0)),
        redis_ceiling: Some(Rate::new(5000, 1.0)),
        forward: Some(Forward {
            rate: Rate::new(forward as u64, 1.0),
            cpu_seconds: 0.1,
            cpu_seconds_per_100k: 10.0,
            redis_cpu_per_100k: None,
            broker_cpu_per_100k: None,
            peak_rss_bytes: 10 << 20,
            duplicates: 0,
        }),
        ..Report::default()
    }
}

/// The first of `rows` whose measurement starts with `prefix`.
fn find(rows: &[Row], prefix: &str) -> Row {
    rows.iter()
        .find(|r| r.measurement.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line {prefix:?}"))
        .clone()
}

#[test]
fn forwarding_is_judged_against_the_broker_ceiling() {
    let pass = amqp_report(950.0);
    let row = find(&pass.rows(), "forwarding rate (");
    assert_eq!((row.ratio.as_str(), row.result.as_str()), ("95%", "PASS"));
    assert!(pass.all_passed());
    assert!(!amqp_report(850.0).all_passed());
}

#[test]
fn kafka_uses_the_lower_ceiling_and_an_absolute_floor() {
    let mut r = amqp_report(850.0);
    r.settings.sink = "kafka".into();
    r.redis_ceiling = Some(Rate::new(1100, 1.0));
    let rows = r.rows();
    let rel = find(&rows, "forwarding rate (");
    assert_eq!((rel.ratio.as_str(), rel.result.as_str()), ("85%", "PASS"));
    let abs = find(&rows, "forwarding rate, absolute");
    assert_eq!(abs.result, "MISS");
}

#[test]
fn the_backlog_is_judged_against_its_own_ceiling() {
    let mut r = amqp_report(950.0);
    r.backlog_ceiling = Some(Rate::new(500, 1.0));
    r.backlog = r.forward.as_ref().map(|f| Forward {
        rate: Rate::new(440, 1.0),
        broker_cpu_per_100k: None,
        ..*f
    });
    let row = find(&r.rows(), "backlog rate (");
    assert_eq!((row.ratio.as_str(), row.result.as_str()), ("88%", "MISS"));
    assert!(!r.all_passed());
}

#[test]
fn the_cluster_is_judged_against_the_standalone_and_broker_ceilings() {
    let mut r = amqp_report(950.0);
    r.redis_ceiling = Some(Rate::new(2000, 1.0));
    r.cluster = Some(ClusterRun {
        masters: 3,
        shards: 12,
        spread: vec![3, 4, 5],
        one_shard: Rate::new(1800, 1.0),
        all_shards: Rate::new(2100, 1.0),
        forward: Rate::new(790, 1.0),
    });
    let rows = r.rows();
    let spread = find(&rows, "cluster redis ceiling, 12 shards");
    assert_eq!(
        (spread.ratio.as_str(), spread.result.as_str()),
        ("105% of standalone", "PASS")
    );
    let forward = find(&rows, "cluster forwarding rate");
    assert_eq!(
        (forward.ratio.as_str(), forward.result.as_str()),
        ("79%", "MISS")
    );
    assert!(!r.all_passed());
}

#[test]
fn json_lists_the_goals() {
    let v: serde_json::Value = serde_json::from_str(&amqp_report(950.0).json().unwrap()).unwrap();
    assert_eq!(v["goals"].as_array().unwrap().len(), 1);
    assert_eq!(v["all_passed"], true);
    assert_eq!(v["broker_ceiling"]["msg_per_s"], 1000.0);
}

#[test]
fn redis_and_broker_cpu_are_shown_beside_the_bridges_when_measured() {
    let mut r = amqp_report(950.0);
    assert!(!r
        .rows()
        .iter()
        .any(|row| row.measurement.contains("meanwhile")));
    if let Some(f) = r.forward.as_mut() {
        f.redis_cpu_per_100k = Some(0.71);
        f.broker_cpu_per_100k = Some(ProcessCpu {
            process: "beam.smp".into(),
            seconds_per_100k: 3.5,
        });
    }
    let rows = r.rows();
    let shown: Vec<(&str, &str)> = rows
        .iter()
        .filter(|row| row.measurement.contains("meanwhile"))
        .map(|row| (row.measurement.as_str(), row.bridge.as_str()))
        .collect();
    assert_eq!(
        shown,
        [
            ("  redis server CPU per 100k messages, meanwhile", "0.71 s"),
            (
                "  broker CPU per 100k messages, meanwhile (beam.smp)",
                "3.50 s"
            ),
        ]
    );
}
