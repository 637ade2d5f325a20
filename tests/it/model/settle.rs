//! Settling a batch, lease expiry, recovery and the sweep of stale attempt entries.

use super::*;

impl Case {
    /// Settles one open batch (picked by `which`) with `disp` cycled over its members; a
    /// claimed id without a body is dead-lettered as `missing_body`, bar a put-back.
    pub(super) async fn settle(&mut self, which: usize, disp: &[Disp]) -> Step {
        if self.m.open.is_empty() {
            return Ok(());
        }
        let b = self.m.open.remove(which % self.m.open.len());
        let plan: Vec<Disp> = b
            .items
            .iter()
            .enumerate()
            .map(|(i, c)| match disp[i % disp.len()] {
                d if c.body != Body::Missing || d == Disp::PutBack => d,
                _ => Disp::Missing,
            })
            .collect();
        let s = settlement(&b, &plan);
        let t0 = self.now().await;
        let got = self
            .store
            .settle(b.deadline, self.max_attempts, &s)
            .await
            .unwrap();
        let t1 = self.now().await;

        let mut released = 0;
        let acked = self.settled_acks(&b, &plan);
        check_eq!(got.acked, acked, "acked count");
        bump(&self.tally.acked, acked);

        let outcomes = self
            .settled_failures(&b, &plan, (t0, t1), &mut released)
            .await?;
        check_eq!(
            got.fail_outcomes,
            outcomes,
            "fail outcomes of batch {} ({plan:?})",
            b.id
        );

        let back = self.settled_put_backs(&b, s.put_backs(), &mut released);
        check_eq!(got.put_back, back, "put back count");
        check_eq!(got.released, released, "released count");
        bump(&self.tally.put_back, back);
        Ok(())
    }

    /// Acks part of one open batch (picked by `which`) as a worker does while the broker
    /// confirms the rest: those of its first `take` members that have a body. The batch stays
    /// open with the others, for another early ack or its final settle.
    pub(super) async fn early_ack(&mut self, which: usize, take: usize) -> Step {
        if self.m.open.is_empty() {
            return Ok(());
        }
        let at = which % self.m.open.len();
        let b = self.m.open.remove(at);
        let (mut now, mut rest) = (b.empty_like(), b.empty_like());
        for (k, (c, sch)) in b.items.into_iter().zip(b.schedules).enumerate() {
            let part = if k < take && c.body != Body::Missing {
                &mut now
            } else {
                &mut rest
            };
            part.items.push(c);
            part.schedules.push(sch);
        }
        let plan = vec![Disp::Ack; now.items.len()];
        let s = settlement(&now, &plan);
        let got = self
            .store
            .settle(now.deadline, self.max_attempts, &s)
            .await
            .unwrap();
        let acked = self.settled_acks(&now, &plan);
        check_eq!(got.acked, acked, "early acked count");
        check_eq!(got.put_back, 0, "early put back count");
        check_eq!(got.released, 0, "early released count");
        bump(&self.tally.acked, acked);
        bump(&self.tally.early_acks, 1);
        if !rest.items.is_empty() {
            self.m.open.insert(at, rest);
        }
        Ok(())
    }

    /// Whether `member`'s lease is still batch `batch`'s.
    fn owns(&self, member: &[u8], batch: u64) -> bool {
        self.m
            .inflight
            .get(member)
            .is_some_and(|l| l.batch == batch)
    }

    /// Acks: the broker has the message, whoever holds the lease now; only this batch's own
    /// leases end. Returns how many did.
    fn settled_acks(&mut self, b: &OpenBatch, plan: &[Disp]) -> u64 {
        let mut acked = 0;
        for ((c, d), schedules) in b.items.iter().zip(plan).zip(&b.schedules) {
            if *d != Disp::Ack {
                continue;
            }
            self.m.delivered.extend(schedules.iter().copied());
            if self.owns(&c.member, b.id) {
                self.m.inflight.remove(&c.member);
                self.m.entry_deleted(&c.member);
                acked += 1;
                // Hash mode: the body goes with the last copy of its id.
                if let Some(bodies) = &mut self.m.bodies {
                    if self.m.source.contains_key(&c.member) || self.m.dead.contains_key(&c.member)
                    {
                        bump(&self.tally.ack_kept_body, 1);
                    } else {
                        bodies.held.remove(&c.member);
                        bump(&self.tally.ack_dropped_body, 1);
                    }
                }
            } else {
                bump(&self.tally.acks_not_owned, 1);
            }
        }
        acked
    }

    /// Failures: each owned lease ends retried or dead-lettered, the scores read from Redis
    /// within the clock readings `(t0, t1)` around the settle. Returns the outcomes; counts
    /// the copies merged with a new schedule in `released`.
    async fn settled_failures(
        &mut self,
        b: &OpenBatch,
        plan: &[Disp],
        (t0, t1): (i64, i64),
        released: &mut u64,
    ) -> Result<Vec<FailOutcome>, TestCaseError> {
        let mut outcomes = Vec::new();
        for (c, d) in b.items.iter().zip(plan) {
            let member = &c.member;
            if !matches!(
                d,
                Disp::Retry | Disp::RetryLater | Disp::Dead | Disp::Missing
            ) {
                continue;
            }
            if !self.owns(member, b.id) {
                outcomes.push(FailOutcome::NotOwned);
                bump(&self.tally.not_owned, 1);
                continue;
            }
            let lease = self.m.inflight.remove(member).expect("owned");
            let failures = lease.failures + 1;
            if matches!(d, Disp::Dead | Disp::Missing) || failures >= i64::from(self.max_attempts) {
                self.m.entry_deleted(member);
                let dead_key = self.keys.dead.clone();
                let at = self.adopt_score(&dead_key, member, t0, t1).await?;
                let reason = match d {
                    Disp::Dead => "too_large",
                    Disp::Missing => "missing_body",
                    Disp::Retry => "nack",
                    _ => "returned",
                };
                let mut schedules = lease.schedules;
                if let Some(old) = self.m.dead.remove(member) {
                    schedules.extend(old.schedules);
                }
                self.m.dead.insert(
                    member.clone(),
                    DeadEntry {
                        at,
                        reason: reason.into(),
                        detail: detail_of(reason).map(str::to_string),
                        attempts: failures,
                        schedules,
                        // A forward of the earlier dead copy no longer holds this one.
                        forward: None,
                    },
                );
                if self.m.source.contains_key(member) {
                    *released += 1;
                }
                outcomes.push(FailOutcome::DeadLettered);
                bump(&self.tally.dead, 1);
            } else {
                let delay = if *d == Disp::RetryLater {
                    RETRY_LATER.as_millis() as i64
                } else {
                    0
                };
                let at = if self.m.source.contains_key(member) {
                    0.0
                } else {
                    let src = self.keys.source.clone();
                    self.adopt_score(&src, member, t0 + delay, t1 + delay)
                        .await?
                };
                if self.m.reschedule(member, at, failures, lease.schedules) {
                    *released += 1;
                    bump(&self.tally.merged, 1);
                }
                outcomes.push(FailOutcome::Retried);
                bump(&self.tally.retried, 1);
            }
        }
        Ok(outcomes)
    }

    /// Put-backs: each owned lease goes back with its original score. Returns how many did;
    /// counts the copies merged with a new schedule in `released`.
    fn settled_put_backs(
        &mut self,
        b: &OpenBatch,
        put_back: &[&Claimed],
        released: &mut u64,
    ) -> u64 {
        let mut back = 0;
        for c in put_back {
            if self.owns(&c.member, b.id) {
                let lease = self.m.inflight.remove(&c.member).expect("owned");
                let score = parse_score(&c.due_raw);
                if self
                    .m
                    .reschedule(&c.member, score, lease.failures, lease.schedules)
                {
                    *released += 1;
                    bump(&self.tally.merged, 1);
                }
                back += 1;
            }
        }
        back
    }

    /// Waits until every short lease, in flight or of a forwarded dead letter, is past.
    pub(super) async fn expire(&mut self) -> Step {
        let forwards = self.m.dead.values().filter_map(|e| match e.forward {
            Some(Forward::Leased {
                deadline,
                short: true,
                ..
            }) => Some(deadline),
            _ => None,
        });
        let Some(last) = self
            .m
            .inflight
            .values()
            .filter(|l| l.short)
            .map(|l| l.deadline)
            .chain(forwards)
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

    pub(super) async fn recover(&mut self, limit: usize) -> Step {
        let t0 = self.now().await;
        let got = self.store.recover(limit, None).await.unwrap();
        let t1 = self.now().await;
        let n = got.recovered as usize;
        check_eq!(got.swept, 0, "swept without a cursor");
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
            let lease = self.m.inflight.remove(m).expect("leased");
            let at = if self.m.source.contains_key(m) {
                0.0
            } else {
                let src = self.keys.source.clone();
                self.adopt_score(&src, m, t0, t1).await?
            };
            if self
                .m
                .reschedule(m, at, lease.failures + 1, lease.schedules)
            {
                bump(&self.tally.merged, 1);
            }
        }
        bump(&self.tally.recovered, n as u64);
        Ok(())
    }

    pub(super) async fn sweep(&mut self) -> Step {
        let mut cursor = "0".to_string();
        for _ in 0..100 {
            let got = self.store.recover(0, Some(&cursor)).await.unwrap();
            check_eq!(got.recovered, 0, "recovered with limit 0");
            bump(&self.tally.swept, got.swept);
            cursor = got.cursor;
            if cursor == "0" {
                break;
            }
        }
        check_eq!(cursor.as_str(), "0", "sweep finished a pass");
        self.m.left.clear();
        let stale = self.attempt_entries().await?.1;
        check!(
            stale.is_empty(),
            "stale attempt entries after a sweep: {stale:?}"
        );
        Ok(())
    }
}

/// The settlement a worker sends for batch `b` with one disposition per member.
fn settlement<'a>(b: &'a OpenBatch, plan: &[Disp]) -> Settlement<'a> {
    let mut s = Settlement::for_batch(b.items.len());
    for (c, d) in b.items.iter().zip(plan) {
        let fail = |retry_in, reason: &'static str, permanent| Failure {
            member: &c.member,
            retry_in,
            reason: reason.into(),
            permanent,
            detail: detail_of(reason).map(str::to_string),
        };
        match d {
            Disp::Ack => s.ack(&c.member, Confirmed::unpublished()),
            Disp::Retry => s.fail(fail(Duration::ZERO, "nack", false)),
            Disp::RetryLater => s.fail(fail(RETRY_LATER, "returned", false)),
            Disp::Dead => s.fail(fail(Duration::ZERO, "too_large", true)),
            Disp::PutBack => s.put_back(c),
            Disp::Missing => s.fail(fail(Duration::ZERO, "missing_body", true)),
        }
    }
    s
}
