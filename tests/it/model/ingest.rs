//! The ingress's store step: `ingest.lua` stores an id once, scheduled or dead-lettered.

use super::*;

impl Case {
    /// An ingress's store (`ingest.lua`), once per id: an id scheduled, in flight or dead
    /// changes nothing; otherwise its body is written, a stale attempt entry dropped, and the
    /// id scheduled (at a time, or a delay on the Redis clock) or dead-lettered.
    pub(super) async fn ingest(&mut self, member: &[u8], how: HowIngest, payload: Payload) -> Step {
        let body = self.next_body(member, payload);
        let (reason, detail) = match how {
            HowIngest::Dead(i) => INGEST_REASONS[i],
            _ => ("", ""),
        };
        let at = match how {
            HowIngest::At(when) => self.due(when).0 as i64,
            _ => 0,
        };
        let call = match how {
            HowIngest::In(ms) => Ingest::In(ms),
            HowIngest::At(_) => Ingest::At(at),
            HowIngest::Dead(_) => Ingest::Dead { reason, detail },
        };
        let before = self.now().await;
        let done = self
            .store
            .ingest(member, &body, call)
            .await
            .map_err(|e| TestCaseError::fail(format!("ingest: {e}")))?;
        let after = self.now().await;
        let held = self
            .m
            .source
            .get(member)
            .map(|s| s.score)
            .or_else(|| self.m.inflight.get(member).map(|l| l.deadline as f64))
            .or_else(|| self.m.dead.get(member).map(DeadEntry::score));
        check_eq!(done.stored, held.is_none(), "ingest of {member:?}: stored");
        if let Some(score) = held {
            bump(&self.tally.ingest_duplicates, 1);
            if score.is_finite() {
                check_eq!(
                    done.at_ms,
                    score as i64,
                    "ingest of {member:?}: the time found"
                );
            }
            return Ok(());
        }
        self.m.left.remove(member);
        let b = self.m.bodies.as_mut().expect("hash mode");
        b.held.insert(member.to_vec(), body.clone());
        b.written.insert(member.to_vec(), body);
        b.bare.remove(member);
        match how {
            HowIngest::Dead(_) => {
                let dead = self.keys.dead.clone();
                let at = self.adopt_score(&dead, member, before, after).await?;
                check_eq!(
                    done.at_ms,
                    at as i64,
                    "ingest of {member:?}: dead-lettered at"
                );
                let id = self.m.next_schedule;
                self.m.next_schedule += 1;
                self.m.started.push(id);
                let entry = DeadEntry {
                    at,
                    reason: reason.to_string(),
                    detail: (!detail.is_empty()).then(|| detail.to_string()),
                    attempts: 0,
                    schedules: vec![id],
                    forward: None,
                };
                self.m.dead.insert(member.to_vec(), entry);
                bump(&self.tally.ingest_dead, 1);
            }
            HowIngest::In(ms) => {
                let d = ms.max(0);
                let source = self.keys.source.clone();
                let score = self
                    .adopt_score(&source, member, before + d, after + d)
                    .await?;
                check_eq!(done.at_ms, score as i64, "ingest of {member:?}: due");
                self.scheduled(member, score);
                bump(&self.tally.ingest_stored, 1);
            }
            HowIngest::At(_) => {
                check_eq!(done.at_ms, at, "ingest of {member:?}: due");
                self.scheduled(member, at as f64);
                bump(&self.tally.ingest_stored, 1);
            }
        }
        Ok(())
    }
}
