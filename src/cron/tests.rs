//! The stated DST behaviour and `schedule next` across the 2026 changes of time.

use super::Cron;

fn ms(rfc3339: &str) -> i64 {
    chrono::DateTime::parse_from_rfc3339(rfc3339)
        .unwrap()
        .timestamp_millis()
}

fn iso(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap()
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// The next `n` ticks after `from`, in UTC.
fn next(expr: &str, tz: &str, from: &str, n: usize) -> Vec<String> {
    let cron = Cron::parse(expr, tz).unwrap();
    let mut at = ms(from);
    let mut out = Vec::new();
    for _ in 0..n {
        at = cron.next_after(at).unwrap();
        out.push(iso(at));
    }
    out
}

#[test]
fn a_time_in_the_spring_gap_fires_at_its_end() {
    // 02:30 does not exist on 2026-03-29 in Berlin: it fires at 03:00 CEST.
    assert_eq!(
        next("0 30 2 * * *", "Europe/Berlin", "2026-03-27T12:00:00Z", 3),
        [
            "2026-03-28T01:30:00Z",
            "2026-03-29T01:00:00Z",
            "2026-03-30T00:30:00Z"
        ]
    );
}

#[test]
fn a_time_in_the_autumn_overlap_fires_once() {
    // 02:30 happens twice on 2026-10-25 in Berlin: it fires at the first, 00:30Z, only.
    assert_eq!(
        next("0 30 2 * * *", "Europe/Berlin", "2026-10-24T12:00:00Z", 3),
        [
            "2026-10-25T00:30:00Z",
            "2026-10-26T01:30:00Z",
            "2026-10-27T01:30:00Z"
        ]
    );
}

#[test]
fn steps_over_the_gap_and_the_overlap() {
    // Every 15 minutes over the gap (02:00-03:00 CET does not exist): no tick is made up.
    assert_eq!(
        next("0 */15 * * * *", "Europe/Berlin", "2026-03-29T00:30:00Z", 4),
        [
            "2026-03-29T00:45:00Z",
            "2026-03-29T01:00:00Z",
            "2026-03-29T01:15:00Z",
            "2026-03-29T01:30:00Z"
        ]
    );
    // Every 15 minutes over the overlap: elapsed time, every instant once.
    let overlap = next("0 */15 * * * *", "Europe/Berlin", "2026-10-25T00:30:00Z", 6);
    assert_eq!(
        overlap,
        [
            "2026-10-25T00:45:00Z",
            "2026-10-25T01:00:00Z",
            "2026-10-25T01:15:00Z",
            "2026-10-25T01:30:00Z",
            "2026-10-25T01:45:00Z",
            "2026-10-25T02:00:00Z"
        ]
    );
}

#[test]
fn new_york_changes_of_2026() {
    // Spring: 2026-03-08 02:00 EST -> 03:00 EDT. Fall: 2026-11-01 02:00 EDT -> 01:00 EST.
    assert_eq!(
        next("30 2 * * *", "America/New_York", "2026-03-07T12:00:00Z", 3),
        [
            "2026-03-08T07:00:00Z",
            "2026-03-09T06:30:00Z",
            "2026-03-10T06:30:00Z"
        ]
    );
    assert_eq!(
        next("30 1 * * *", "America/New_York", "2026-10-31T12:00:00Z", 3),
        [
            "2026-11-01T05:30:00Z",
            "2026-11-02T06:30:00Z",
            "2026-11-03T06:30:00Z"
        ]
    );
}

#[test]
fn a_zone_without_dst_keeps_its_offset() {
    // Asia/Tokyo: UTC+9 all year.
    assert_eq!(
        next("0 0 9 * * *", "Asia/Tokyo", "2026-03-28T12:00:00Z", 2),
        ["2026-03-29T00:00:00Z", "2026-03-30T00:00:00Z"]
    );
    assert_eq!(
        next("0 0 9 * * *", "Asia/Tokyo", "2026-10-24T12:00:00Z", 2),
        ["2026-10-25T00:00:00Z", "2026-10-26T00:00:00Z"]
    );
}

#[test]
fn expressions_and_zones_are_checked() {
    assert!(Cron::parse("0 30 2 * * *", "Europe/Berlin").is_ok());
    assert!(Cron::parse("30 2 * * *", "UTC").is_ok());
    assert!(Cron::parse("@daily", "UTC").is_ok());
    assert!(Cron::parse("61 * * * *", "UTC").is_err());
    assert!(Cron::parse("not cron", "UTC").is_err());
    assert!(Cron::parse("* * * * *", "Mars/Olympus").is_err());
    assert!(!super::tz_version().is_empty());
}
