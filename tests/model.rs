//! Model-based property test: random producer and worker steps against the real scripts and an in-memory model.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use delay_bridge::keys::QueueKeys;
use delay_bridge::store::{FailOutcome, Settlement, Store};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use redis::aio::MultiplexedConnection;

/// Members the steps pick from: few, so producer writes and claims collide often. Includes the
/// empty member and bytes that are not UTF-8.
const POOL: [&[u8]; 7] = [b"a", b"b", b"", b"\xff\x00\xfe", b"{\"id\":7}", b"c", b"a "];

/// Lease of a "short" claim: expired as soon as the Redis clock moves past the claim time.
const SHORT_LEASE: Duration = Duration::ZERO;
/// Lease of a "long" claim: never expires while a case runs.
const LONG_LEASE: Duration = Duration::from_secs(600);
const RETRY_LATER: Duration = Duration::from_secs(3600);

#[derive(Debug, Clone, Copy)]
enum When {
    /// Overdue by `1 + k` seconds.
    Past(u8),
    /// Due in an hour plus `k` seconds.
    Future(u8),
    NegInf,
    PosInf,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Disp {
    Ack,
    /// Retriable failure, due again at once.
    Retry,
    /// Retriable failure, due again in an hour.
    RetryLater,
    /// Permanent failure: dead-lettered at once.
    Dead,
    /// Never attempted: back with its original score.
    PutBack,
}

#[derive(Debug, Clone)]
enum Op {
    /// `ZADD`: a new message, or a reschedule when the member is already there.
    Schedule {
        member: usize,
        when: When,
    },
    /// `ZREM` on the source set.
    Cancel {
        member: usize,
    },
    Claim {
        batch: usize,
        short: bool,
    },
    /// Settles one open batch (picked by index) with one disposition per member (cycled).
    Settle {
        which: usize,
        disp: Vec<Disp>,
    },
    /// Waits until every short lease in flight is past its deadline on the Redis clock.
    Expire,
    Recover {
        limit: usize,
    },
    /// Requeues the named dead letters, or the oldest `limit` when none is named.
    Requeue {
        members: Vec<usize>,
        limit: usize,
    },
}

fn when() -> impl Strategy<Value = When> {
    prop_oneof![
        4 => (0u8..4).prop_map(When::Past),
        2 => (0u8..4).prop_map(When::Future),
        1 => Just(When::NegInf),
        1 => Just(When::PosInf),
    ]
}

fn disp() -> impl Strategy<Value = Disp> {
    prop_oneof![
        4 => Just(Disp::Ack),
        2 => Just(Disp::Retry),
        1 => Just(Disp::RetryLater),
        1 => Just(Disp::Dead),
        2 => Just(Disp::PutBack),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..POOL.len(), when()).prop_map(|(member, when)| Op::Schedule { member, when }),
        1 => (0..POOL.len()).prop_map(|member| Op::Cancel { member }),
        4 => (1usize..5, any::<bool>()).prop_map(|(batch, short)| Op::Claim { batch, short }),
        4 => (any::<usize>(), vec(disp(), 1..4)).prop_map(|(which, disp)| Op::Settle { which, disp }),
        1 => Just(Op::Expire),
        2 => (0usize..4).prop_map(|limit| Op::Recover { limit }),
        3 => (vec(0..POOL.len(), 0..3), 0usize..3)
            .prop_map(|(members, limit)| Op::Requeue { members, limit }),
    ]
}

/// A claimed batch the "worker" has not settled yet.
#[derive(Debug, Clone)]
struct OpenBatch {
    id: u64,
    deadline: i64,
    /// (member, due score as Redis printed it)
    items: Vec<(Vec<u8>, Vec<u8>)>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Lease {
    batch: u64,
    deadline: i64,
    short: bool,
}

#[derive(Debug, Clone, PartialEq)]
struct DeadEntry {
    at: f64,
    reason: String,
    attempts: i64,
}

/// Where a member that is in no Redis set went.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Gone {
    Delivered,
    Cancelled,
}

/// The specification: what every step should do to the queue.
#[derive(Default, Debug)]
struct Model {
    source: HashMap<Vec<u8>, f64>,
    inflight: HashMap<Vec<u8>, Lease>,
    dead: HashMap<Vec<u8>, DeadEntry>,
    /// Attempts that did not end in a confirmation (failures and expired leases).
    attempts: HashMap<Vec<u8>, i64>,
    /// Fate of members in no set.
    gone: HashMap<Vec<u8>, Gone>,
    /// Members a producer wrote while they were in flight or dead: legitimately in two sets.
    overlap: HashSet<Vec<u8>>,
    /// Members a producer ever scheduled.
    written: HashSet<Vec<u8>>,
    open: Vec<OpenBatch>,
    next_batch: u64,
}

/// Counts over all cases, to show the steps really exercised each path.
#[derive(Default)]
struct Tally {
    steps: AtomicU64,
    claimed: AtomicU64,
    acked: AtomicU64,
    retried: AtomicU64,
    dead: AtomicU64,
    put_back: AtomicU64,
    not_owned: AtomicU64,
    recovered: AtomicU64,
    requeued: AtomicU64,
    overlaps: AtomicU64,
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// Whether one of the members a claim at `now` takes is in flight with lease deadline `deadline`.
fn due_members_held_until(m: &Model, now: i64, batch: usize, deadline: i64) -> bool {
    let mut due: Vec<(Vec<u8>, f64)> = m
        .source
        .iter()
        .filter(|(_, s)| **s <= now as f64)
        .map(|(m, s)| (m.clone(), *s))
        .collect();
    due.sort_by(by_score);
    due.iter().take(batch).any(|(member, _)| {
        m.inflight
            .get(member)
            .is_some_and(|l| l.deadline == deadline)
    })
}

/// Redis orders equal scores by member bytes.
fn by_score(a: &(Vec<u8>, f64), b: &(Vec<u8>, f64)) -> std::cmp::Ordering {
    a.1.total_cmp(&b.1).then_with(|| a.0.cmp(&b.0))
}

fn parse_score(raw: &[u8]) -> f64 {
    let s = std::str::from_utf8(raw).expect("scores are ASCII");
    match s {
        "inf" | "+inf" => f64::INFINITY,
        "-inf" => f64::NEG_INFINITY,
        s => s.parse().expect("a number"),
    }
}

struct Case {
    conn: MultiplexedConnection,
    store: Store,
    keys: QueueKeys,
    max_attempts: u32,
    /// Redis time when the case started: past and future scores are relative to it.
    base: i64,
    m: Model,
    tally: &'static Tally,
}

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

impl Case {
    async fn now(&mut self) -> i64 {
        common::redis_now(&mut self.conn).await
    }

    async fn zrange(&mut self, key: &str) -> Vec<(Vec<u8>, f64)> {
        redis::cmd("ZRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(&mut self.conn)
            .await
            .unwrap()
    }

    async fn zscore(&mut self, key: &str, member: &[u8]) -> Option<f64> {
        redis::cmd("ZSCORE")
            .arg(key)
            .arg(member)
            .query_async(&mut self.conn)
            .await
            .unwrap()
    }

    /// Adopts the score a script gave `member` from the Redis clock, after checking it lies
    /// between the clock readings around the call.
    async fn adopt_score(
        &mut self,
        key: &str,
        member: &[u8],
        lo: i64,
        hi: i64,
    ) -> Result<f64, TestCaseError> {
        let score = self.zscore(key, member).await;
        let Some(score) = score else {
            return Err(TestCaseError::fail(format!(
                "{member:?} missing from {key}"
            )));
        };
        check!(
            (lo as f64..=hi as f64).contains(&score),
            "{member:?} in {key} has score {score}, expected within [{lo}, {hi}]"
        );
        Ok(score)
    }

    async fn step(&mut self, op: &Op) -> Step {
        match op {
            Op::Schedule { member, when } => self.schedule(POOL[*member], *when).await,
            Op::Cancel { member } => self.cancel(POOL[*member]).await,
            Op::Claim { batch, short } => self.claim(*batch, *short).await,
            Op::Settle { which, disp } => self.settle(*which, disp).await,
            Op::Expire => self.expire().await,
            Op::Recover { limit } => self.recover(*limit).await,
            Op::Requeue { members, limit } => self.requeue(members, *limit).await,
        }
    }

    async fn schedule(&mut self, member: &[u8], when: When) -> Step {
        let score = match when {
            When::Past(k) => (self.base - 1000 - i64::from(k) * 1000) as f64,
            When::Future(k) => (self.base + 3_600_000 + i64::from(k) * 1000) as f64,
            When::NegInf => f64::NEG_INFINITY,
            When::PosInf => f64::INFINITY,
        };
        let arg = match when {
            When::NegInf => "-inf".to_string(),
            When::PosInf => "+inf".to_string(),
            _ => format!("{}", score as i64),
        };
        let _: i64 = redis::cmd("ZADD")
            .arg(&self.keys.source)
            .arg(arg)
            .arg(member)
            .query_async(&mut self.conn)
            .await
            .unwrap();
        if self.m.inflight.contains_key(member) || self.m.dead.contains_key(member) {
            self.m.overlap.insert(member.to_vec());
            bump(&self.tally.overlaps, 1);
        }
        self.m.source.insert(member.to_vec(), score);
        self.m.written.insert(member.to_vec());
        self.m.gone.remove(member);
        Ok(())
    }

    async fn cancel(&mut self, member: &[u8]) -> Step {
        let n: i64 = redis::cmd("ZREM")
            .arg(&self.keys.source)
            .arg(member)
            .query_async(&mut self.conn)
            .await
            .unwrap();
        let was = self.m.source.remove(member).is_some();
        check_eq!(n == 1, was, "ZREM of {member:?}");
        if was && !self.m.inflight.contains_key(member) && !self.m.dead.contains_key(member) {
            self.m.gone.insert(member.to_vec(), Gone::Cancelled);
        }
        Ok(())
    }

    async fn claim(&mut self, batch: usize, short: bool) -> Step {
        let lease = if short { SHORT_LEASE } else { LONG_LEASE };
        let got = self.store.claim(batch, lease).await.unwrap();
        let now = got.now_ms;
        // The deadline is now + lease, moved on by a millisecond at a time only when a claimed
        // member is still leased (by an unsettled batch) with that very deadline.
        let mut deadline = now + lease.as_millis() as i64;
        while due_members_held_until(&self.m, now, batch, deadline) {
            deadline += 1;
        }
        check_eq!(got.deadline_ms, deadline, "claim deadline");

        let mut due: Vec<(Vec<u8>, f64)> = self
            .m
            .source
            .iter()
            .filter(|(_, s)| **s <= now as f64)
            .map(|(m, s)| (m.clone(), *s))
            .collect();
        due.sort_by(by_score);
        due.truncate(batch);
        let want: Vec<(Vec<u8>, f64, u32)> = due
            .iter()
            .map(|(m, s)| {
                (
                    m.clone(),
                    *s,
                    self.m.attempts.get(m).copied().unwrap_or(0) as u32 + 1,
                )
            })
            .collect();
        let seen: Vec<(Vec<u8>, f64, u32)> = got
            .items
            .iter()
            .map(|c| (c.member.clone(), parse_score(&c.due_raw), c.attempt))
            .collect();
        check_eq!(seen, want, "claimed (member, due, attempt) at now={now}");

        for (m, _) in &due {
            self.m.source.remove(m);
            self.m.inflight.insert(
                m.clone(),
                Lease {
                    batch: self.m.next_batch,
                    deadline: got.deadline_ms,
                    short,
                },
            );
        }
        let mut rest: Vec<(Vec<u8>, f64)> =
            self.m.source.iter().map(|(m, s)| (m.clone(), *s)).collect();
        rest.sort_by(by_score);
        check_eq!(
            got.next_head_ms,
            rest.first().map(|(_, s)| *s),
            "next head after claim"
        );

        bump(&self.tally.claimed, due.len() as u64);
        if !due.is_empty() {
            self.m.open.push(OpenBatch {
                id: self.m.next_batch,
                deadline: got.deadline_ms,
                items: got
                    .items
                    .iter()
                    .map(|c| (c.member.clone(), c.due_raw.clone()))
                    .collect(),
            });
        }
        self.m.next_batch += 1;
        Ok(())
    }

    async fn settle(&mut self, which: usize, disp: &[Disp]) -> Step {
        if self.m.open.is_empty() {
            return Ok(());
        }
        let b = self.m.open.remove(which % self.m.open.len());
        let plan: Vec<Disp> = (0..b.items.len()).map(|i| disp[i % disp.len()]).collect();
        let mut s = Settlement::default();
        let mut fail_plan = Vec::new();
        for ((m, due), d) in b.items.iter().zip(&plan) {
            match d {
                Disp::Ack => s.ack.push(m),
                Disp::Retry => s.fail.push((m, Duration::ZERO, "nack", false)),
                Disp::RetryLater => s.fail.push((m, RETRY_LATER, "returned", false)),
                Disp::Dead => s.fail.push((m, Duration::ZERO, "too_large", true)),
                Disp::PutBack => s.put_back.push((m, due)),
            }
            if matches!(d, Disp::Retry | Disp::RetryLater | Disp::Dead) {
                fail_plan.push((m.clone(), *d));
            }
        }
        let t0 = self.now().await;
        let got = self
            .store
            .settle(b.deadline, self.max_attempts, &s)
            .await
            .unwrap();
        let t1 = self.now().await;

        // Acks first: a confirmed member is delivered whoever holds its lease now.
        let mut acked = 0;
        for m in &s.ack {
            if self.m.inflight.remove(*m).is_some() {
                acked += 1;
            }
            self.m.attempts.remove(*m);
            if !self.m.source.contains_key(*m) && !self.m.dead.contains_key(*m) {
                self.m.gone.insert(m.to_vec(), Gone::Delivered);
            }
        }
        check_eq!(got.acked, acked, "acked count");
        bump(&self.tally.acked, acked);

        let owns =
            |m: &Model, member: &[u8]| m.inflight.get(member).is_some_and(|l| l.batch == b.id);
        let mut outcomes = Vec::new();
        for (member, d) in &fail_plan {
            if !owns(&self.m, member) {
                outcomes.push(FailOutcome::NotOwned);
                bump(&self.tally.not_owned, 1);
                continue;
            }
            self.m.inflight.remove(member);
            let failures = self.m.attempts.get(member).copied().unwrap_or(0) + 1;
            if *d == Disp::Dead || failures >= i64::from(self.max_attempts) {
                self.m.attempts.remove(member);
                let dead_key = self.keys.dead.clone();
                let at = self.adopt_score(&dead_key, member, t0, t1).await?;
                let reason = if *d == Disp::Dead {
                    "too_large"
                } else if *d == Disp::Retry {
                    "nack"
                } else {
                    "returned"
                };
                self.m.dead.insert(
                    member.clone(),
                    DeadEntry {
                        at,
                        reason: reason.into(),
                        attempts: failures,
                    },
                );
                outcomes.push(FailOutcome::DeadLettered);
                bump(&self.tally.dead, 1);
            } else {
                self.m.attempts.insert(member.clone(), failures);
                if !self.m.source.contains_key(member) {
                    let delay = if *d == Disp::RetryLater {
                        RETRY_LATER.as_millis() as i64
                    } else {
                        0
                    };
                    let src = self.keys.source.clone();
                    let at = self
                        .adopt_score(&src, member, t0 + delay, t1 + delay)
                        .await?;
                    self.m.source.insert(member.clone(), at);
                }
                outcomes.push(FailOutcome::Retried);
                bump(&self.tally.retried, 1);
            }
        }
        check_eq!(
            got.fail_outcomes,
            outcomes,
            "fail outcomes of batch {} ({plan:?})",
            b.id
        );

        let mut back = 0;
        for (member, due) in &s.put_back {
            if owns(&self.m, member) {
                self.m.inflight.remove(*member);
                self.m
                    .source
                    .entry(member.to_vec())
                    .or_insert_with(|| parse_score(due));
                back += 1;
            }
        }
        check_eq!(got.put_back, back, "put back count");
        bump(&self.tally.put_back, back);
        Ok(())
    }

    async fn expire(&mut self) -> Step {
        let Some(last) = self
            .m
            .inflight
            .values()
            .filter(|l| l.short)
            .map(|l| l.deadline)
            .max()
        else {
            return Ok(());
        };
        let end = Instant::now() + Duration::from_secs(2);
        while self.now().await <= last {
            check!(
                Instant::now() < end,
                "Redis clock did not pass {last} within 2 s"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(())
    }

    async fn recover(&mut self, limit: usize) -> Step {
        let t0 = self.now().await;
        let n = self.store.recover(limit).await.unwrap() as usize;
        let t1 = self.now().await;
        let mut leases: Vec<(Vec<u8>, f64)> = self
            .m
            .inflight
            .iter()
            .map(|(m, l)| (m.clone(), l.deadline as f64))
            .collect();
        leases.sort_by(by_score);
        // The script's clock reading lies in [t0, t1]: expired means deadline < now.
        let surely = leases.iter().filter(|(_, d)| *d < t0 as f64).count();
        check!(n <= limit, "recovered {n} > limit {limit}");
        check!(
            n >= surely.min(limit),
            "recovered {n}, but {surely} leases had expired (limit {limit})"
        );
        for (m, d) in &leases[..n] {
            check!(
                d.total_cmp(&(t1 as f64)).is_lt(),
                "recovered {m:?} whose lease {d} had not expired by {t1}"
            );
            self.m.inflight.remove(m);
            *self.m.attempts.entry(m.clone()).or_insert(0) += 1;
            if !self.m.source.contains_key(m) {
                let src = self.keys.source.clone();
                let at = self.adopt_score(&src, m, t0, t1).await?;
                self.m.source.insert(m.clone(), at);
            }
        }
        bump(&self.tally.recovered, n as u64);
        Ok(())
    }

    async fn requeue(&mut self, members: &[usize], limit: usize) -> Step {
        let named: Vec<Vec<u8>> = members.iter().map(|i| POOL[*i].to_vec()).collect();
        let t0 = self.now().await;
        let n = self.store.requeue_dead(&named, limit).await.unwrap();
        let t1 = self.now().await;
        let targets: Vec<Vec<u8>> = if named.is_empty() {
            let mut dead: Vec<(Vec<u8>, f64)> =
                self.m.dead.iter().map(|(m, e)| (m.clone(), e.at)).collect();
            dead.sort_by(by_score);
            dead.into_iter().take(limit).map(|(m, _)| m).collect()
        } else {
            named
        };
        let mut moved = 0;
        for m in targets {
            if self.m.dead.remove(&m).is_none() {
                continue;
            }
            moved += 1;
            self.m.attempts.remove(&m);
            if !self.m.source.contains_key(&m) {
                let src = self.keys.source.clone();
                let at = self.adopt_score(&src, &m, t0, t1).await?;
                self.m.source.insert(m, at);
            }
        }
        check_eq!(
            n,
            moved,
            "requeued count (names {members:?}, limit {limit})"
        );
        bump(&self.tally.requeued, moved);
        Ok(())
    }

    /// Redis holds exactly the model's state, and every member is in exactly one place.
    async fn verify(&mut self) -> Step {
        let keys = self.keys.clone();
        let source: BTreeMap<Vec<u8>, f64> = self.zrange(&keys.source).await.into_iter().collect();
        let want: BTreeMap<Vec<u8>, f64> = self.m.source.clone().into_iter().collect();
        check_eq!(source, want, "scheduled set");

        let inflight: BTreeMap<Vec<u8>, f64> =
            self.zrange(&keys.inflight).await.into_iter().collect();
        let want: BTreeMap<Vec<u8>, f64> = self
            .m
            .inflight
            .iter()
            .map(|(m, l)| (m.clone(), l.deadline as f64))
            .collect();
        check_eq!(inflight, want, "in-flight set");

        let dead: BTreeMap<Vec<u8>, f64> = self.zrange(&keys.dead).await.into_iter().collect();
        let want: BTreeMap<Vec<u8>, f64> =
            self.m.dead.iter().map(|(m, e)| (m.clone(), e.at)).collect();
        check_eq!(dead, want, "dead-letter set");

        let attempts: BTreeMap<Vec<u8>, i64> = redis::cmd("HGETALL")
            .arg(&keys.attempts)
            .query_async(&mut self.conn)
            .await
            .unwrap();
        let want: BTreeMap<Vec<u8>, i64> = self.m.attempts.clone().into_iter().collect();
        check_eq!(attempts, want, "attempts hash");

        let reasons: BTreeMap<Vec<u8>, String> = redis::cmd("HGETALL")
            .arg(&keys.dead_reasons)
            .query_async(&mut self.conn)
            .await
            .unwrap();
        let reasons: BTreeMap<Vec<u8>, DeadEntry> = reasons
            .into_iter()
            .map(|(m, json)| {
                let v: serde_json::Value = serde_json::from_str(&json).expect("reason is JSON");
                let entry = DeadEntry {
                    at: v["at"].as_f64().unwrap_or(f64::NAN),
                    reason: v["reason"].as_str().unwrap_or("?").to_string(),
                    attempts: v["attempts"].as_i64().unwrap_or(-1),
                };
                (m, entry)
            })
            .collect();
        let want: BTreeMap<Vec<u8>, DeadEntry> = self.m.dead.clone().into_iter().collect();
        check_eq!(reasons, want, "dead-letter reasons");

        // Conservation: each member ever written is scheduled, in flight, dead, delivered or
        // cancelled, and in two sets only after a producer rewrote it while in flight or dead.
        for member in POOL {
            let places = [
                source.contains_key(member),
                inflight.contains_key(member),
                dead.contains_key(member),
            ]
            .iter()
            .filter(|p| **p)
            .count();
            if places > 1 {
                check!(
                    self.m.overlap.contains(member),
                    "{member:?} is in {places} sets without a producer rewrite"
                );
            } else {
                self.m.overlap.remove(member);
            }
            if places == 0 && self.m.written.contains(member) {
                check!(
                    self.m.gone.contains_key(member),
                    "{member:?} vanished: in no set, yet neither delivered nor cancelled"
                );
            }
        }
        Ok(())
    }
}

async fn run_case(
    conn: &MultiplexedConnection,
    manager: &redis::aio::ConnectionManager,
    max_attempts: u32,
    ops: &[Op],
    tally: &'static Tally,
) -> Step {
    let key = if rand::random::<bool>() {
        format!("{}:{{m}}", common::unique("model"))
    } else {
        common::unique("model")
    };
    let keys = QueueKeys::derive(&key).unwrap();
    let mut conn = conn.clone();
    let base = common::redis_now(&mut conn).await;
    let mut case = Case {
        conn: conn.clone(),
        store: Store::new(manager.clone(), keys.clone()),
        keys,
        max_attempts,
        base,
        m: Model::default(),
        tally,
    };
    let mut result = Ok(());
    for (i, op) in ops.iter().enumerate() {
        bump(&tally.steps, 1);
        let r = match case.step(op).await {
            Ok(()) => case.verify().await,
            e => e,
        };
        if let Err(e) = r {
            result = Err(TestCaseError::fail(format!("step {i} {op:?}: {e}")));
            break;
        }
    }
    common::cleanup_keys(&mut conn, &key).await;
    result
}

#[test]
fn scripts_agree_with_the_model() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (conn, manager) = rt.block_on(async {
        let client = redis::Client::open(common::redis_url()).unwrap();
        (
            common::redis().await,
            client
                .get_connection_manager()
                .await
                .expect("Redis must run on loopback"),
        )
    });
    static TALLY: std::sync::LazyLock<Tally> = std::sync::LazyLock::new(Tally::default);
    let cases = std::env::var("MODEL_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(64);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let started = Instant::now();
    let result = runner.run(&(1u32..5, vec(op(), 1..40)), |(max_attempts, ops)| {
        rt.block_on(run_case(&conn, &manager, max_attempts, &ops, &TALLY))
    });
    let t = &*TALLY;
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    eprintln!(
        "model: {} steps in {:?}: claimed {}, acked {}, retried {}, dead {}, put back {}, \
         not owned {}, recovered {}, requeued {}, producer overlaps {}",
        get(&t.steps),
        started.elapsed(),
        get(&t.claimed),
        get(&t.acked),
        get(&t.retried),
        get(&t.dead),
        get(&t.put_back),
        get(&t.not_owned),
        get(&t.recovered),
        get(&t.requeued),
        get(&t.overlaps),
    );
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// A producer may re-add a member while it is in flight; if that copy is claimed in the same
/// millisecond with the same lease, the two leases must still be told apart, or the first
/// batch's settle (a retry, a dead letter, a put-back) would act on the second batch's claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_batch_cannot_settle_a_newer_claim_of_the_same_member() {
    let mut conn = common::redis().await;
    let key = common::unique("model-token");
    let keys = QueueKeys::derive(&key).unwrap();
    let manager = redis::Client::open(common::redis_url())
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    let store = Store::new(manager, keys.clone());
    let mut collided = 0;
    for i in 0..200 {
        let member = format!("m{i}");
        let zadd = |conn: &mut MultiplexedConnection| {
            let mut c = conn.clone();
            let (key, member) = (key.clone(), member.clone());
            async move {
                let _: i64 = redis::cmd("ZADD")
                    .arg(&key)
                    .arg(0)
                    .arg(&member)
                    .query_async(&mut c)
                    .await
                    .unwrap();
            }
        };
        zadd(&mut conn).await;
        let first = store.claim(1, LONG_LEASE).await.unwrap();
        assert_eq!(first.items.len(), 1);
        zadd(&mut conn).await;
        // Pick the second lease so that, if the clock has not ticked, both deadlines coincide.
        let t = common::redis_now(&mut conn).await;
        let lease = Duration::from_millis((first.deadline_ms - t) as u64);
        let second = store.claim(1, lease).await.unwrap();
        assert_eq!(second.items.len(), 1);
        if second.now_ms != t {
            continue;
        }
        collided += 1;
        assert_ne!(
            second.deadline_ms, first.deadline_ms,
            "two live claims of {member} share the deadline token"
        );
        let s = Settlement {
            fail: vec![(member.as_bytes(), Duration::ZERO, "nack", false)],
            put_back: vec![],
            ack: vec![],
        };
        let settled = store.settle(first.deadline_ms, 3, &s).await.unwrap();
        assert_eq!(settled.fail_outcomes, vec![FailOutcome::NotOwned]);
        let held: Option<f64> = redis::cmd("ZSCORE")
            .arg(&keys.inflight)
            .arg(&member)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(
            held,
            Some(second.deadline_ms as f64),
            "still leased by the second claim"
        );
        if collided >= 5 {
            break;
        }
    }
    common::cleanup_keys(&mut conn, &key).await;
    assert!(
        collided > 0,
        "the clock ticked between every pair of claims; try again"
    );
}
