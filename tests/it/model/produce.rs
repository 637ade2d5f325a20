//! The producer's steps: schedule, produce (hash mode), reschedule and cancel.

use super::*;

impl Case {
    /// The score `when` stands for, and how a producer writes it.
    pub(super) fn due(&self, when: When) -> (f64, String) {
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
        (score, arg)
    }

    /// The model of a producer `ZADD` of `member` at `score`.
    pub(super) fn scheduled(&mut self, member: &[u8], score: f64) {
        match self.m.source.get_mut(member) {
            // A reschedule: the same schedule, a new time, a fresh count (the stamp no longer
            // matches, unless the producer happened to write the very score it had, or
            // writes back the score a stale count was stamped with).
            Some(s) => {
                if s.score != score {
                    let (failures, stamp) = (s.failures, s.score);
                    s.score = score;
                    self.m.leave(member, failures, stamp);
                    let revived = self.m.revive(member, score);
                    self.m.source.get_mut(member).expect("scheduled").failures = revived;
                }
            }
            None => {
                let id = self.m.next_schedule;
                self.m.next_schedule += 1;
                self.m.started.push(id);
                let failures = self.m.revive(member, score);
                self.m.source.insert(
                    member.to_vec(),
                    Scheduled {
                        score,
                        failures,
                        schedules: vec![id],
                    },
                );
            }
        }
    }

    pub(super) async fn schedule(&mut self, member: &[u8], when: When) -> Step {
        let (score, arg) = self.due(when);
        let _: i64 = redis::cmd("ZADD")
            .arg(&self.keys.source)
            .arg(arg)
            .arg(member)
            .query_async(&mut self.conn)
            .await
            .unwrap();
        self.scheduled(member, score);
        // Hash mode: the producer bug. An id that still has a body keeps it.
        if let Some(b) = &mut self.m.bodies {
            if !b.held.contains_key(member) {
                b.bare.insert(member.to_vec());
            }
        }
        Ok(())
    }

    /// The next body a producer (or an ingress) writes for `member`.
    pub(super) fn next_body(&mut self, member: &[u8], payload: Payload) -> Vec<u8> {
        let b = self.m.bodies.as_mut().expect("hash mode");
        let body = match payload {
            Payload::Versioned(pad) => {
                let mut v = member.to_vec();
                v.extend_from_slice(format!("#{}", b.next_version).as_bytes());
                v.resize(v.len() + usize::from(pad), b'.');
                v
            }
            Payload::Empty => Vec::new(),
        };
        b.next_version += 1;
        body
    }

    pub(super) async fn produce(&mut self, member: &[u8], when: When, payload: Payload) -> Step {
        let (score, arg) = self.due(when);
        let body = self.next_body(member, payload);
        let b = self.m.bodies.as_mut().expect("hash mode");
        let () = redis::pipe()
            .atomic()
            .cmd("HSET")
            .arg(&self.keys.bodies)
            .arg(member)
            .arg(&body)
            .ignore()
            .cmd("ZADD")
            .arg(&self.keys.source)
            .arg(arg)
            .arg(member)
            .ignore()
            .query_async(&mut self.conn)
            .await
            .unwrap();
        b.held.insert(member.to_vec(), body.clone());
        b.written.insert(member.to_vec(), body);
        b.bare.remove(member);
        self.scheduled(member, score);
        Ok(())
    }

    pub(super) async fn reschedule(&mut self, member: &[u8], when: When) -> Step {
        let (score, arg) = self.due(when);
        let _: i64 = redis::cmd("ZADD")
            .arg(&self.keys.source)
            .arg("XX")
            .arg(arg)
            .arg(member)
            .query_async(&mut self.conn)
            .await
            .unwrap();
        if self.m.source.contains_key(member) {
            self.scheduled(member, score);
        }
        Ok(())
    }

    pub(super) async fn cancel(&mut self, member: &[u8]) -> Step {
        let n: i64 = if self.m.bodies.is_some() {
            // The producers' script as they run it: unschedules the id, and drops its body
            // unless a copy in flight or dead still needs it.
            static SCRIPT: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
                redis::Script::new(delay_bridge::parts::redis::store::CANCEL)
            });
            SCRIPT
                .key(&self.keys.source)
                .key(&self.keys.inflight)
                .key(&self.keys.dead)
                .key(&self.keys.bodies)
                .arg(member)
                .invoke_async(&mut self.conn)
                .await
                .unwrap()
        } else {
            redis::cmd("ZREM")
                .arg(&self.keys.source)
                .arg(member)
                .query_async(&mut self.conn)
                .await
                .unwrap()
        };
        let was = self.m.source.remove(member);
        check_eq!(n == 1, was.is_some(), "ZREM of {member:?}");
        if let Some(s) = was {
            // The count stays in the hash under the cancelled score.
            self.m.leave(member, s.failures, s.score);
            self.m.cancelled.extend(s.schedules);
            if let Some(b) = &mut self.m.bodies {
                if self.m.inflight.contains_key(member) || self.m.dead.contains_key(member) {
                    bump(&self.tally.cancel_kept_body, 1);
                } else if b.held.remove(member).is_some() {
                    bump(&self.tally.cancel_dropped_body, 1);
                }
            }
        }
        Ok(())
    }
}
