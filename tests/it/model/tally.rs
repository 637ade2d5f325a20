//! Counts over all cases, to show the steps really exercised each path.

use super::*;

pub(super) fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// The paths this test exists for that no step has taken yet.
pub(super) fn missing_paths(t: &Tally, hash: bool) -> Vec<&'static str> {
    let mut paths = vec![
        ("claims", &t.claimed),
        ("claims timed inside a millisecond", &t.sub_ms_clocks),
        ("in-flight skips", &t.skipped_in_flight),
        ("acks of a lost lease", &t.acks_not_owned),
        ("early acks of part of a batch", &t.early_acks),
        ("merges", &t.merged),
        ("wrong-type calls", &t.wrong_type),
        ("claims while paused", &t.paused_claims),
        ("claims that waited for the rate", &t.rate_waits),
        ("claims cut by the rate", &t.cut_by_rate),
        ("stray control writes", &t.stray_writes),
        ("rate bucket repairs", &t.bucket_repairs),
        ("operator moves", &t.moved),
        ("purged members", &t.purged),
        ("browsed members", &t.browsed),
        ("forward claims", &t.forward_claimed),
        ("forwards claimed again after expiry", &t.forward_reclaimed),
        ("forwards confirmed", &t.forwards_confirmed),
        ("forwards refused", &t.forwards_refused),
        ("forwards kept", &t.forwards_kept),
        ("forwards released", &t.forwards_released),
        ("forward settles not owned", &t.forwards_not_owned),
        (
            "forward claims skipping a leased letter",
            &t.forward_skipped_leased,
        ),
        (
            "forward claims skipping a refused letter",
            &t.forward_skipped_refused,
        ),
        ("forward claims while paused", &t.forward_claims_paused),
    ];
    if hash {
        paths.extend([
            ("claims of a missing body", &t.missing_claimed),
            ("claims cut by the budget", &t.cut_by_budget),
            ("bodies kept by an ack", &t.ack_kept_body),
            ("bodies dropped by a cancel", &t.cancel_dropped_body),
            ("bodies dropped by a forward", &t.forward_dropped_body),
            ("ingests stored", &t.ingest_stored),
            ("ingests of an id already held", &t.ingest_duplicates),
            ("ingests dead-lettered", &t.ingest_dead),
        ]);
    }
    paths
        .into_iter()
        .filter(|(_, c)| c.load(Ordering::Relaxed) == 0)
        .map(|(what, _)| what)
        .collect()
}

/// Prints what the steps of `rounds` rounds of `cases` cases exercised, in `elapsed`.
pub(super) fn report(t: &Tally, hash: bool, rounds: u32, cases: u32, elapsed: Duration) {
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    eprintln!(
        "model{}: {} steps in {:?} ({rounds} rounds of {cases} cases): claimed {}, skipped in \
         flight {}, acked {}, acks not owned {}, retried {}, dead {}, put back {}, merged {}, \
         not owned {}, recovered {}, swept {}, \
         requeued {}, wrong-type calls {}, claims while paused {}, rate waits {}, claims cut \
         by the rate {}, moved {}, purged {}, browsed {}; forwards: claimed {}, claimed again \
         after expiry {}, confirmed {}, refused {}, kept {}, released {}, settles not owned {}, claims \
         skipping a leased letter {}, claims skipping a refused letter {}, claims while paused {}; \
         stray control writes {}, rate bucket repairs {}",
        if hash { " (hash payloads)" } else { "" },
        get(&t.steps),
        elapsed,
        get(&t.claimed),
        get(&t.skipped_in_flight),
        get(&t.acked),
        get(&t.acks_not_owned),
        get(&t.retried),
        get(&t.dead),
        get(&t.put_back),
        get(&t.merged),
        get(&t.not_owned),
        get(&t.recovered),
        get(&t.swept),
        get(&t.requeued),
        get(&t.wrong_type),
        get(&t.paused_claims),
        get(&t.rate_waits),
        get(&t.cut_by_rate),
        get(&t.moved),
        get(&t.purged),
        get(&t.browsed),
        get(&t.forward_claimed),
        get(&t.forward_reclaimed),
        get(&t.forwards_confirmed),
        get(&t.forwards_refused),
        get(&t.forwards_kept),
        get(&t.forwards_released),
        get(&t.forwards_not_owned),
        get(&t.forward_skipped_leased),
        get(&t.forward_skipped_refused),
        get(&t.forward_claims_paused),
        get(&t.stray_writes),
        get(&t.bucket_repairs),
    );
    if hash {
        eprintln!(
            "bodies: claimed {}, missing {}, claims cut by the budget {}, dropped by an ack {}, \
             kept by an ack {}, dropped by a cancel {}, kept by a cancel {}, dropped by a \
             forward {}, kept by a forward {}, forwarded without one {}; ingests: stored {}, \
             already held {}, dead-lettered {}",
            get(&t.bodies_claimed),
            get(&t.missing_claimed),
            get(&t.cut_by_budget),
            get(&t.ack_dropped_body),
            get(&t.ack_kept_body),
            get(&t.cancel_dropped_body),
            get(&t.cancel_kept_body),
            get(&t.forward_dropped_body),
            get(&t.forward_kept_body),
            get(&t.forward_missing_body),
            get(&t.ingest_stored),
            get(&t.ingest_duplicates),
            get(&t.ingest_dead),
        );
    }
}
