//! Dead letters and members in flight, as operators list them: pages bounded by a byte
//! budget, previews that read no large body.

use super::cursor::{Cursor, CURSOR_MEMBER_MAX};
use super::operate::{LIST_BODY_MAX, LIST_BUDGET, MAX_PAGE, PREVIEW};
use super::{Store, StoreError};
use crate::redis::scripts::SCRIPTS;

/// One dead letter, as `dead-letter list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// The member (the id in hash payload mode).
    pub member: Vec<u8>,
    /// When it was dead-lettered, epoch ms.
    pub at_ms: i64,
    /// JSON with the reason and the attempt count.
    pub reason: Option<String>,
    /// Hash payload mode: its body's size in bytes (`None` if it has none).
    pub body_size: Option<u64>,
    /// Hash payload mode: the body's first bytes (at most [`PREVIEW`]); empty when the body
    /// is over [`LIST_BODY_MAX`], which a list never reads.
    pub body_preview: Vec<u8>,
    /// Its dead-letter score as Redis takes it (`inf` for `+inf`), for a cursor after it.
    pub score: String,
}

/// One page of dead letters, oldest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadPage {
    /// The dead letters.
    pub items: Vec<DeadLetter>,
    /// Where the next page starts; `None` on the last page.
    pub next: Option<Cursor>,
}

impl Store {
    /// Moves dead letters back to the source set: the named ones, or up to `limit` of the oldest.
    pub async fn requeue_dead(&self, members: &[Vec<u8>], limit: usize) -> Result<u64, StoreError> {
        let mut conn = self.conn.clone();
        let mut inv = self.keyed(&SCRIPTS.requeue);
        inv.arg(limit);
        for m in members {
            inv.arg(m.as_slice());
        }
        Ok(inv.invoke_async(&mut conn).await?)
    }

    /// Lists up to `limit` dead letters, oldest first, with their reason (and body's size and
    /// first bytes, in hash payload mode); fewer once the members read reach
    /// [`LIST_BUDGET`](LIST_BUDGET) bytes (inline, a member is the whole message),
    /// read a few at a time so no call copies more than that and one member.
    pub async fn list_dead(&self, limit: usize) -> Result<Vec<DeadLetter>, StoreError> {
        Ok(self.list_dead_after(None, limit).await?.items)
    }

    /// The rank in the dead-letter set at which a page after `after` starts: a few calls
    /// whatever the set holds (a binary search among the members of the cursor's score when
    /// its member has left since).
    async fn dead_start(&self, after: &Cursor) -> Result<usize, StoreError> {
        let mut conn = self.conn.clone();
        let dead = &self.keys.dead;
        let (below, upto): (usize, usize) = redis::pipe()
            .zcount(dead, "-inf", format!("({}", after.score()))
            .zcount(dead, "-inf", after.score())
            .query_async(&mut conn)
            .await?;
        if let Some(place) = after.place() {
            return Ok(below.saturating_add(usize::try_from(place).unwrap_or(usize::MAX)) + 1);
        }
        let (rank, score): (Option<usize>, Option<f64>) = redis::pipe()
            .zrank(dead, after.member())
            .zscore(dead, after.member())
            .query_async(&mut conn)
            .await?;
        if let (Some(rank), Some(score)) = (rank, score) {
            if after.score().parse::<f64>().ok() == Some(score) {
                return Ok(rank + 1);
            }
        }
        let (mut lo, mut hi) = (below, upto);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let at: Vec<Vec<u8>> = redis::cmd("ZRANGE")
                .arg(dead)
                .arg(mid)
                .arg(mid)
                .query_async(&mut conn)
                .await?;
            match at.first() {
                Some(m) if m.as_slice() <= after.member() => lo = mid + 1,
                _ => hi = mid,
            }
        }
        Ok(lo)
    }

    /// A page of [`Store::list_dead`] starting after `after` (a cursor by score and member, as
    /// the scheduled pages have), with the cursor of the next page.
    pub async fn list_dead_after(
        &self,
        after: Option<&Cursor>,
        limit: usize,
    ) -> Result<DeadPage, StoreError> {
        let (items, next) = self.dead_members(after, limit).await?;
        Ok(DeadPage {
            items: self.dead_letters(items).await?,
            next,
        })
    }

    /// Deletes the dead letters whose reason is `reason` (with `dry_run`, only counts them):
    /// the set is read a page of 1,000 members at a time with their reasons, and each page's
    /// matches go in one purge script call, which checks each again. Returns how many.
    pub async fn purge_dead_reason(&self, reason: &str, dry_run: bool) -> Result<u64, StoreError> {
        let mut after: Option<Cursor> = None;
        let mut n = 0;
        loop {
            let (items, next) = self.dead_members(after.as_ref(), MAX_PAGE).await?;
            if items.is_empty() {
                return Ok(n);
            }
            let mut conn = self.conn.clone();
            let mut hmget = redis::cmd("HMGET");
            hmget.arg(&self.keys.dead_reasons);
            for (m, _) in &items {
                hmget.arg(m.as_slice());
            }
            let reasons: Vec<Option<String>> = hmget.query_async(&mut conn).await?;
            let matching: Vec<&[u8]> = items
                .iter()
                .zip(&reasons)
                .filter(|(_, r)| {
                    r.as_deref()
                        .and_then(|r| serde_json::from_str::<serde_json::Value>(r).ok())
                        .is_some_and(|r| r.get("reason").and_then(|r| r.as_str()) == Some(reason))
                })
                .map(|((m, _), _)| m.as_slice())
                .collect();
            if dry_run {
                n += matching.len() as u64;
            } else if !matching.is_empty() {
                let mut inv = self.keyed(&SCRIPTS.purge);
                inv.arg("dead_reason")
                    .arg(MAX_PAGE)
                    .arg("-inf")
                    .arg("+inf")
                    .arg(self.hash_flag())
                    .arg(reason);
                for m in matching {
                    inv.arg(m);
                }
                let deleted: u64 = inv.invoke_async(&mut conn).await?;
                n += deleted;
            }
            match next {
                Some(c) => after = Some(c),
                None => return Ok(n),
            }
        }
    }

    /// The members and scores of a page of dead letters after `after`, and the next cursor.
    async fn dead_members(
        &self,
        after: Option<&Cursor>,
        limit: usize,
    ) -> Result<(Vec<(Vec<u8>, f64)>, Option<Cursor>), StoreError> {
        let start = match after {
            Some(c) => self.dead_start(c).await?,
            None => 0,
        };
        let (items, exhausted) = self.ranks(&self.keys.dead, start, limit).await?;
        let mut conn = self.conn.clone();
        let next = match items.last().filter(|_| !exhausted) {
            None => None,
            Some((member, score)) if member.len() > CURSOR_MEMBER_MAX => {
                let below: usize = redis::cmd("ZCOUNT")
                    .arg(&self.keys.dead)
                    .arg("-inf")
                    .arg(format!("({score}"))
                    .query_async(&mut conn)
                    .await?;
                let rank = start + items.len() - 1;
                Some(Cursor::at_place(
                    score.to_string(),
                    rank.saturating_sub(below) as u64,
                ))
            }
            Some((member, score)) => Some(Cursor::after(score.to_string(), member.clone())),
        };
        Ok((items, next))
    }

    /// Up to `limit` members in flight, earliest lease deadline first, with that deadline
    /// (epoch ms); fewer once the members read reach [`LIST_BUDGET`](LIST_BUDGET)
    /// bytes, as the dead-letter list.
    pub async fn list_inflight(&self, limit: usize) -> Result<Vec<(Vec<u8>, i64)>, StoreError> {
        let (items, _) = self.ranks(&self.keys.inflight, 0, limit).await?;
        Ok(items
            .into_iter()
            .map(|(member, deadline)| (member, deadline as i64))
            .collect())
    }

    /// Up to `limit` members of the sorted set `key` from rank `start` on, with their scores;
    /// fewer once the members read reach [`LIST_BUDGET`](LIST_BUDGET) bytes. Read one
    /// first, then as many at once as the budget left holds at the largest size seen, so no
    /// call copies more than the budget and one member. Says whether the set ended there.
    async fn ranks(
        &self,
        key: &str,
        start: usize,
        limit: usize,
    ) -> Result<(Vec<(Vec<u8>, f64)>, bool), StoreError> {
        const STEP: usize = 16;
        let mut conn = self.conn.clone();
        let mut items: Vec<(Vec<u8>, f64)> = Vec::new();
        let (mut spent, mut largest) = (0, 0);
        while items.len() < limit && spent < LIST_BUDGET {
            let from = start + items.len();
            let step = match items.len() {
                0 => 1,
                _ => ((LIST_BUDGET - spent) / largest.max(1)).clamp(1, STEP),
            };
            let to = (from + step).min(start + limit) - 1;
            let chunk: Vec<(Vec<u8>, f64)> = redis::cmd("ZRANGE")
                .arg(key)
                .arg(from)
                .arg(to)
                .arg("WITHSCORES")
                .query_async(&mut conn)
                .await?;
            let done = chunk.len() < to + 1 - from;
            let (read, mut taken) = (chunk.len(), 0);
            for entry in chunk {
                if spent >= LIST_BUDGET {
                    break;
                }
                spent += entry.0.len();
                largest = largest.max(entry.0.len());
                items.push(entry);
                taken += 1;
            }
            if done {
                return Ok((items, taken == read));
            }
        }
        Ok((items, false))
    }

    /// The dead letters of `items` (members and scores) with their reasons and previews.
    async fn dead_letters(
        &self,
        items: Vec<(Vec<u8>, f64)>,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        let mut conn = self.conn.clone();
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let mut hmget = redis::cmd("HMGET");
        hmget.arg(&self.keys.dead_reasons);
        for (m, _) in &items {
            hmget.arg(m.as_slice());
        }
        let reasons: Vec<Option<String>> = hmget.query_async(&mut conn).await?;
        let members: Vec<&[u8]> = items.iter().map(|(m, _)| m.as_slice()).collect();
        let bodies = if self.hash_bodies() {
            self.previews(&members).await?
        } else {
            vec![(None, Vec::new()); items.len()]
        };
        Ok(items
            .into_iter()
            .zip(reasons.into_iter().zip(bodies))
            .map(
                |((member, at), (reason, (body_size, body_preview)))| DeadLetter {
                    member,
                    score: at.to_string(),
                    at_ms: dead_at_ms(at as i64, reason.as_deref()),
                    reason,
                    body_size,
                    body_preview,
                },
            )
            .collect())
    }

    /// Each id's body size and first [`PREVIEW`] bytes (hash payload mode), reading no body
    /// over [`LIST_BODY_MAX`]: the sizes come from HSTRLEN, which reads nothing, and only the
    /// small bodies are then fetched, so a list costs Redis kilobytes whatever is stored.
    pub(crate) async fn previews(
        &self,
        ids: &[&[u8]],
    ) -> Result<Vec<(Option<u64>, Vec<u8>)>, StoreError> {
        let mut conn = self.conn.clone();
        let mut sizes = redis::pipe();
        for id in ids {
            sizes.hexists(&self.keys.bodies, *id);
            sizes.cmd("HSTRLEN").arg(&self.keys.bodies).arg(*id);
        }
        let sizes: Vec<u64> = sizes.query_async(&mut conn).await?;
        let sizes: Vec<Option<u64>> = sizes
            .chunks(2)
            .map(|p| (p[0] == 1).then_some(p[1]))
            .collect();
        let small: Vec<&[u8]> = ids
            .iter()
            .zip(&sizes)
            .filter(|(_, s)| s.is_some_and(|s| s > 0 && s <= LIST_BODY_MAX))
            .map(|(id, _)| *id)
            .collect();
        let mut read: Vec<Option<Vec<u8>>> = Vec::new();
        if !small.is_empty() {
            let mut hmget = redis::cmd("HMGET");
            hmget.arg(&self.keys.bodies);
            for id in &small {
                hmget.arg(*id);
            }
            read = hmget.query_async(&mut conn).await?;
        }
        let mut read = read.into_iter();
        Ok(sizes
            .into_iter()
            .map(|size| {
                let mut preview = Vec::new();
                if size.is_some_and(|s| s > 0 && s <= LIST_BODY_MAX) {
                    preview = read.next().flatten().unwrap_or_default();
                    preview.truncate(PREVIEW);
                }
                (size, preview)
            })
            .collect())
    }
}

/// When a dead letter was dead-lettered, from its dead-letter score: a letter the broker
/// refused to take as a forwarded dead letter has the score `+inf`, and its time is then
/// the `at` of its reason JSON.
pub(crate) fn dead_at_ms(score_ms: i64, reason: Option<&str>) -> i64 {
    if score_ms != i64::MAX {
        return score_ms;
    }
    reason
        .and_then(|r| serde_json::from_str::<serde_json::Value>(r).ok())
        .and_then(|v| v.get("at").and_then(serde_json::Value::as_f64))
        .map_or(score_ms, |at| at as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_dead_letter_keeps_its_time_in_its_reason() {
        assert_eq!(dead_at_ms(1_000, Some(r#"{"at":5}"#)), 1_000);
        assert_eq!(dead_at_ms(i64::MAX, Some(r#"{"at":5,"reason":"nack"}"#)), 5);
        assert_eq!(dead_at_ms(i64::MAX, Some("not json")), i64::MAX);
        assert_eq!(dead_at_ms(i64::MAX, None), i64::MAX);
    }
}
