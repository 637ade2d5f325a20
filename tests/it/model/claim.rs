//! The claim: the pause, the rate limit, the byte budget, and what it takes.

use super::*;

use delay_bridge::parts::redis::store::ClaimBatch;

/// This machine's clock, epoch µs.
fn wall_us() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_micros()).unwrap_or(i64::MAX)
}

impl Case {
    /// The claim's clock is the Redis server's in µs, read during the call (within a second
    /// of this machine's clock around it, whatever host Redis runs on), and `now` is its
    /// whole milliseconds. Claims whose clock falls inside a millisecond are counted: a
    /// script that gave whole milliseconds in µs would never make one. The script's own
    /// running time fits in the call around it.
    fn check_clock(&self, got: &ClaimBatch, before: i64, after: i64) -> Step {
        let ran = i64::try_from(got.script_time.as_micros()).unwrap_or(i64::MAX);
        check!(
            ran <= after - before + 1_000,
            "the claim script ran {ran} µs in a call of {} µs",
            after - before
        );
        check!(
            (before - 1_000_000..=after + 1_000_000).contains(&got.now_us),
            "claim clock {} µs read between {before} and {after}",
            got.now_us
        );
        check_eq!(got.now_ms, got.now_us.div_euclid(1000), "claim clock in ms");
        if got.now_us % 1000 != 0 {
            bump(&self.tally.sub_ms_clocks, 1);
        }
        Ok(())
    }

    /// Members a claim at `now` may take, earliest first: due and not in flight.
    pub(super) fn claimable(&self, now: i64) -> Vec<(Vec<u8>, f64)> {
        let mut due: Vec<(Vec<u8>, f64)> = self
            .m
            .source
            .iter()
            .filter(|(m, s)| s.score <= now as f64 && !self.m.inflight.contains_key(*m))
            .map(|(m, s)| (m.clone(), s.score))
            .collect();
        due.sort_by(by_score);
        due
    }

    /// Claims with the case's store, or in hash mode with one whose bodies may total `budget`.
    /// With `rated`, by a store with the rate limit [`RATE`].
    pub(super) async fn claim(
        &mut self,
        batch: usize,
        short: bool,
        budget: Option<usize>,
        rated: bool,
    ) -> Step {
        let lease = if short { SHORT_LEASE } else { LONG_LEASE };
        let budget = self.m.bodies.as_ref().map(|_| budget.unwrap_or(ROOMY));
        let store = self.claim_store(budget, rated);
        let before = wall_us();
        let got = store.claim(batch, lease).await.unwrap();
        let now = got.now_ms;
        self.check_clock(&got, before, wall_us())?;
        // Every claim repairs a `paused` value that is not canonical.
        let (paused, odd) = pause_value(&self.m.paused);
        let mut repaired = 0;
        if odd {
            repaired += 1;
            self.m.paused = paused.then(|| "1".to_string());
        }
        check_eq!(got.paused, paused, "claim sees the pause");
        if paused {
            return self.check_paused_claim(&got, lease, repaired);
        }
        // The token bucket, as the script computes it on the Redis clock.
        let asked = batch;
        let mut tokens = None;
        let mut batch = batch;
        // A rate-limited claim checks the bucket: an invalid field empties it as of now.
        let bucket = rated.then(|| self.bucket(now, &mut repaired));
        check_eq!(got.repaired, repaired, "control fields repaired");
        if let Some(t) = bucket {
            if t < 1.0 {
                return self.check_rate_wait(&got, t);
            }
            batch = batch.min(t.floor() as usize);
            tokens = Some(t);
        }
        check_eq!(got.rate_wait, None, "no rate wait");
        self.check_bodies(&got.items, budget)?;
        // now + lease, moved on a millisecond at a time while another lease has that deadline
        // (only when the claim takes something).
        let mut deadline = now + lease.as_millis() as i64;
        let any_due = !self.claimable(now).is_empty();
        if any_due {
            while self.m.inflight.values().any(|l| l.deadline == deadline) {
                deadline += 1;
            }
        }
        check_eq!(got.deadline_ms, deadline, "claim deadline");
        let due = self.check_taken(&got, batch, budget)?;
        check!(
            !any_due || !got.items.is_empty(),
            "claimed nothing while members were due"
        );
        self.lease_taken(&due, &got, short)?;

        bump(&self.tally.claimed, due.len() as u64);
        if let Some(t) = tokens.filter(|_| !due.is_empty()) {
            self.m.tokens = Some((t - due.len() as f64).to_string());
            self.m.at = Some(now.to_string());
            if batch < asked && due.len() == batch {
                bump(&self.tally.cut_by_rate, 1);
            }
        }
        Ok(())
    }

    /// The store a claim runs with: the case's, or in hash mode one with another byte
    /// `budget`; rate-limited with `rated`.
    fn claim_store(&self, budget: Option<usize>, rated: bool) -> Store {
        let mut store = match budget {
            Some(budget) if budget != ROOMY => {
                Store::new(self.manager.clone(), self.keys.clone()).with_hash_bodies(budget)
            }
            _ => self.store.clone(),
        };
        if rated {
            store = store.with_rate_limit(RATE, BURST);
        }
        store
    }

    /// A claim of a paused queue: nothing taken, the lease's deadline, nothing skipped.
    fn check_paused_claim(&self, got: &ClaimBatch, lease: Duration, repaired: u64) -> Step {
        let now = got.now_ms;
        check_eq!(got.repaired, repaired, "repairs while paused");
        check!(got.items.is_empty(), "a paused queue gave {:?}", got.items);
        check_eq!(
            got.deadline_ms,
            now + lease.as_millis() as i64,
            "paused deadline"
        );
        check_eq!((got.skipped, got.next_head_ms), (0, None), "paused reply");
        bump(&self.tally.paused_claims, 1);
        Ok(())
    }

    /// The tokens a rate-limited claim at `now` finds in the bucket; an invalid field empties
    /// it as of now, each counted in `repaired`.
    fn bucket(&mut self, now: i64, repaired: &mut u64) -> f64 {
        let per_ms = RATE / 1000.0;
        let (held, at) = (finite(&self.m.tokens), finite(&self.m.at));
        let bad = u64::from(self.m.tokens.is_some() && !held.is_some_and(|h| h >= 0.0))
            + u64::from(self.m.at.is_some() && !at.is_some_and(|a| a <= now as f64));
        if bad > 0 {
            *repaired += bad;
            self.m.tokens = Some("0".into());
            self.m.at = Some(now.to_string());
            bump(&self.tally.bucket_repairs, 1);
            return 0.0;
        }
        match (held, at) {
            (Some(held), Some(at)) => (BURST as f64).min(held + (now as f64 - at) * per_ms),
            _ => BURST as f64,
        }
    }

    /// A claim that found fewer than one token (`t`): the wait for the next, nothing taken.
    fn check_rate_wait(&self, got: &ClaimBatch, t: f64) -> Step {
        let per_ms = RATE / 1000.0;
        let wait = ((1.0 - t) / per_ms).ceil() as u64;
        check_eq!(
            got.rate_wait,
            Some(Duration::from_millis(wait)),
            "rate wait"
        );
        check!(
            got.items.is_empty(),
            "claimed past the rate: {:?}",
            got.items
        );
        check_eq!(
            (got.skipped, got.next_head_ms),
            (0, None),
            "rate-limited reply"
        );
        bump(&self.tally.rate_waits, 1);
        Ok(())
    }

    /// What the claim should have taken (at most `batch`, within `budget`) and skipped; checks
    /// what it took. Returns the members taken with their scores.
    fn check_taken(
        &self,
        got: &ClaimBatch,
        batch: usize,
        budget: Option<usize>,
    ) -> Result<Vec<(Vec<u8>, f64)>, TestCaseError> {
        let now = got.now_ms;
        let skipped = self
            .m
            .source
            .iter()
            .filter(|(m, s)| s.score <= now as f64 && self.m.inflight.contains_key(*m))
            .count();
        // The claim looks at up to `batch` claimable members; held ones before the last of
        // those are skipped (and counted), any after it are not reached. In hash mode it stops
        // early, at the first member but the first whose body would take it past the budget.
        let mut due_all: Vec<(Vec<u8>, f64)> = self
            .m
            .source
            .iter()
            .filter(|(_, s)| s.score <= now as f64)
            .map(|(m, s)| (m.clone(), s.score))
            .collect();
        due_all.sort_by(by_score);
        let mut due: Vec<(Vec<u8>, f64)> = Vec::new();
        let mut seen_skipped = 0u64;
        let mut bytes = 0;
        for (m, score) in &due_all {
            if due.len() == batch {
                break;
            }
            if self.m.inflight.contains_key(m) {
                seen_skipped += 1;
                continue;
            }
            if let Some(budget) = budget {
                // A missing body weighs nothing, but cannot squeeze past a spent budget either.
                let size = self
                    .m
                    .bodies
                    .as_ref()
                    .and_then(|b| b.held.get(m))
                    .map_or(0, Vec::len);
                if !due.is_empty() && bytes + size > budget {
                    bump(&self.tally.cut_by_budget, 1);
                    break;
                }
                bytes += size;
            }
            due.push((m.clone(), *score));
        }
        check_eq!(got.skipped, seen_skipped, "members skipped as in flight");
        bump(&self.tally.skipped_in_flight, skipped as u64);

        let want: Vec<(Vec<u8>, f64, u32)> = due
            .iter()
            .map(|(m, s)| (m.clone(), *s, self.m.source[m].failures as u32 + 1))
            .collect();
        let seen: Vec<(Vec<u8>, f64, u32)> = got
            .items
            .iter()
            .map(|c| (c.member.clone(), parse_score(&c.due_raw), c.attempt))
            .collect();
        check_eq!(seen, want, "claimed (member, due, attempt) at now={now}");
        Ok(due)
    }

    /// The model after the claim took `due`: each member leased to a new batch, which the
    /// worker holds open; checks the next head the claim reported.
    fn lease_taken(&mut self, due: &[(Vec<u8>, f64)], got: &ClaimBatch, short: bool) -> Step {
        let mut schedules = Vec::new();
        for (m, _) in due {
            let s = self.m.source.remove(m).expect("claimable");
            schedules.push(s.schedules.clone());
            self.m.inflight.insert(
                m.clone(),
                Lease {
                    batch: self.m.next_batch,
                    deadline: got.deadline_ms,
                    short,
                    failures: s.failures,
                    schedules: s.schedules,
                },
            );
        }
        // The next head is the earliest scheduled member that is not in flight.
        let mut rest: Vec<(Vec<u8>, f64)> = self
            .m
            .source
            .iter()
            .filter(|(m, _)| !self.m.inflight.contains_key(*m))
            .map(|(m, s)| (m.clone(), s.score))
            .collect();
        rest.sort_by(by_score);
        check_eq!(
            got.next_head_ms,
            rest.first().map(|(_, s)| *s),
            "next head after claim"
        );
        if !due.is_empty() {
            self.m.open.push(OpenBatch {
                id: self.m.next_batch,
                deadline: got.deadline_ms,
                items: got.items.clone(),
                schedules,
            });
        }
        self.m.next_batch += 1;
        Ok(())
    }

    /// The bodies a claim returned: in hash mode the latest body written for each id, missing
    /// only after the producer bug, and within the budget unless the claim took one member.
    pub(super) fn check_bodies(&self, items: &[Claimed], budget: Option<usize>) -> Step {
        let Some(b) = &self.m.bodies else {
            for c in items {
                check_eq!(
                    c.body,
                    Body::Member,
                    "body of {:?} in inline mode",
                    c.member
                );
            }
            return Ok(());
        };
        for c in items {
            let modelled = match b.held.get(&c.member) {
                Some(body) => Body::Stored(body.clone()),
                None => Body::Missing,
            };
            check_eq!(c.body, modelled, "body claimed with {:?}", c.member);
            match &c.body {
                Body::Stored(body) => {
                    check!(
                        b.written.get(&c.member) == Some(body),
                        "{:?} claimed with {body:?}, but its latest body is {:?}",
                        c.member,
                        b.written.get(&c.member)
                    );
                    bump(&self.tally.bodies_claimed, 1);
                }
                _ => {
                    check!(
                        b.bare.contains(&c.member),
                        "{:?} claimed without a body, but the producer wrote {:?} last",
                        c.member,
                        b.written.get(&c.member)
                    );
                    bump(&self.tally.missing_claimed, 1);
                }
            }
        }
        let budget = budget.expect("hash mode has a budget");
        let bytes: usize = items
            .iter()
            .filter_map(|c| c.payload())
            .map(<[u8]>::len)
            .sum();
        check!(
            items.len() <= 1 || bytes <= budget,
            "claimed {} members with {bytes} body bytes, budget {budget}",
            items.len()
        );
        Ok(())
    }
}
