//! Model-based property test: random producer and worker steps against the real scripts and an in-memory model.
//!
//! Every case runs in one of two payload modes. Inline: the member is the message. Hash: the
//! member is an id, its body lives in the bodies hash, and the producer follows its contract
//! (`HSET` + `ZADD` in one transaction, `ZADD XX` to reschedule, the cancel script it is given
//! in `src/redis/scripts/cancel.lua`), with a rare producer bug thrown in (a `ZADD` with no body).

use crate::common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use delay_bridge::keys::QueueKeys;
use delay_bridge::parts::proof::Confirmed;
use delay_bridge::parts::redis::conn::Conn;
use delay_bridge::parts::redis::store::{
    Body, Claimed, DeadItem, DeadOutcome, DeadSettled, FailOutcome, Failure, Ingest, Purge,
    Settlement, Store,
};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use redis::aio::MultiplexedConnection;

macro_rules! check {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(TestCaseError::fail(format!($($fmt)+)));
        }
    };
}

macro_rules! check_eq {
    ($a:expr, $b:expr, $($fmt:tt)+) => {
        let (a, b) = (&$a, &$b);
        if a != b {
            return Err(TestCaseError::fail(format!(
                "{}: scripts {:?} != model {:?}", format!($($fmt)+), a, b
            )));
        }
    };
}

type Step = Result<(), TestCaseError>;

/// Everything the queue holds in Redis, for comparing before and after a failed call.
type Snapshot = Vec<(String, Vec<(Vec<u8>, Vec<u8>)>)>;

mod case;
mod claim;
mod dead_letters;
mod ingest;
mod operator;
mod ops;
mod produce;
mod schedule;
mod settle;
mod spec;
mod state;
mod tally;
mod verify;
mod wrong_type;

use case::*;
use ops::*;
use spec::*;
use state::*;
use tally::*;

/// Members the steps pick from (ids in hash mode): few, so producer writes and claims collide
/// often. Includes the empty member and bytes that are not UTF-8.
const POOL: [&[u8]; 7] = [b"a", b"b", b"", b"\xff\x00\xfe", b"{\"id\":7}", b"c", b"a "];

/// Lease of a "short" claim: expired as soon as the Redis clock moves past the claim time.
const SHORT_LEASE: Duration = Duration::ZERO;
/// Lease of a "long" claim: never expires while a case runs.
const LONG_LEASE: Duration = Duration::from_secs(600);
/// Lease of a "short" forward of dead letters: expired once the Redis clock is a millisecond
/// past the claim. Not zero: the dead-letter claim takes a letter whose lease is due (`<=
/// now`) and gives it `now + lease` as is, so with a zero lease a letter claimed again in the
/// same millisecond would get the very deadline, the ownership token, of the claim before.
const SHORT_FORWARD_LEASE: Duration = Duration::from_millis(1);
/// The most dead letters one forward claim takes, whatever the limit asked.
const FORWARD_CAP: usize = 1000;
const RETRY_LATER: Duration = Duration::from_secs(3600);
/// Hash mode: the claim byte budget of the case's store, more than any batch's bodies.
const ROOMY: usize = 1 << 20;
/// The rate limit of [`Op::RateClaim`], per second: a case (tens of ms) refills a token or so.
const RATE: f64 = 20.0;
/// The token bucket's size for [`Op::RateClaim`].
const BURST: u32 = 2;

#[test]
fn scripts_agree_with_the_model() {
    run_model(false, case_ops(false));
}

#[test]
fn scripts_agree_with_the_model_in_hash_payload_mode() {
    run_model(true, case_ops(true));
}

/// Runs `MODEL_CASES` cases (256 by default) of steps drawn from `ops`, in hash payload mode
/// or inline.
fn run_model(hash: bool, ops: impl Strategy<Value = Vec<Op>>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (conn, manager) = rt.block_on(async {
        (
            common::redis().await,
            Conn::open(&common::redis_url())
                .await
                .expect("Redis must run on loopback"),
        )
    });
    let tally: &'static Tally = Box::leak(Box::default());
    let cases = std::env::var("MODEL_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(256);
    let started = Instant::now();
    // Another round of fresh cases while a path this test exists for was not taken yet (a
    // rare one can miss a round by chance); three rounds without it fail the test.
    let mut rounds = 0;
    let result = loop {
        rounds += 1;
        let mut runner = TestRunner::new(Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        });
        let result = runner.run(&(1u32..5, &ops), |(max_attempts, ops)| {
            rt.block_on(run_case(&conn, &manager, hash, max_attempts, &ops, tally))
        });
        if result.is_err() || rounds == 3 || missing_paths(tally, hash).is_empty() {
            break result;
        }
    };
    report(tally, hash, rounds, cases, started.elapsed());
    let t = tally;
    if let Err(e) = result {
        panic!("{e}");
    }
    let missing = missing_paths(t, hash);
    assert!(
        missing.is_empty(),
        "no {missing:?} in {rounds} rounds of {cases} cases"
    );
}

/// A count that went stale when the producer moved its copy counts again when the producer
/// writes the stamped score back (an entry belongs to the copy whose score it names).
#[tokio::test]
async fn a_stale_count_counts_again_when_its_score_comes_back() {
    let conn = common::redis().await;
    let manager = Conn::open(&common::redis_url())
        .await
        .expect("Redis must run on loopback");
    let tally: &'static Tally = Box::leak(Box::default());
    let schedule = |when| Op::Schedule { member: 0, when };
    let ops = [
        schedule(When::Past(0)),
        Op::Claim {
            batch: 1,
            short: true,
        },
        // The lease expires once the Redis clock passes the claim's millisecond.
        Op::Recover { limit: 1 },
        Op::Recover { limit: 1 },
        // One failed attempt, moved with the copy by the operator.
        Op::Move {
            member: 0,
            when: When::Past(1),
            earlier: false,
        },
        schedule(When::Future(0)),
        schedule(When::Past(1)),
        Op::Claim {
            batch: 1,
            short: false,
        },
    ];
    run_case(&conn, &manager, false, 3, &ops, tally)
        .await
        .unwrap();
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    assert_eq!(get(&tally.recovered), 1, "the expired lease was recovered");
    assert_eq!(get(&tally.moved), 1, "the operator moved the copy");
}
