//! Whether every recent request to an endpoint got the same status: the evidence that a status like 400 is the endpoint's (a misrouted proxy, a broken deploy), not the message's.
//!
//! Per endpoint (its URL), the last [`WINDOW`] answers, over every trigger and worker of the
//! sink. A status is the endpoint's when every answer there has it, from at least two
//! messages, and the batch it is judged in had no 2xx from that endpoint, unless every
//! message in the window is already proven at fault: a message is, once it failed while
//! another message got a 2xx from the same endpoint (in its batch, or after it). So a few
//! bad messages retried alone after the others went through are still theirs, and a new
//! outage of the endpoint holds the messages it meets.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::sync::OnceLock;

/// Answers kept per endpoint.
const WINDOW: usize = 8;
/// Messages remembered per endpoint as failed, or as proven at fault.
const MEMORY: usize = 256;
/// Endpoints remembered; the least recently answered is forgotten first.
const ENDPOINTS: usize = 1024;

/// A message, by a hash of its member.
pub(super) type Member = u64;

/// The hash a message is known by (the same keys for every sink of the process).
pub(super) fn member(member: &[u8]) -> Member {
    static HASHER: OnceLock<RandomState> = OnceLock::new();
    HASHER.get_or_init(RandomState::new).hash_one(member)
}

/// The recent answers of every endpoint of a sink.
#[derive(Default)]
pub(super) struct Recent {
    by_url: HashMap<String, Window>,
    tick: u64,
}

/// One endpoint's recent answers.
#[derive(Default)]
struct Window {
    /// (member, status), oldest first.
    answers: VecDeque<(Member, u16)>,
    /// Messages whose last answer was not a 2xx, not proven at fault yet.
    failed: VecDeque<Member>,
    /// Messages that failed while another message got a 2xx from the endpoint.
    proven: VecDeque<Member>,
    /// When it was last answered (the map's tick).
    used: u64,
}

fn remember(set: &mut VecDeque<Member>, m: Member) {
    if !set.contains(&m) {
        if set.len() == MEMORY {
            set.pop_front();
        }
        set.push_back(m);
    }
}

fn forget(set: &mut VecDeque<Member>, m: Member) {
    set.retain(|x| *x != m);
}

impl Recent {
    fn window(&mut self, url: &str) -> &mut Window {
        self.tick += 1;
        if !self.by_url.contains_key(url) {
            if self.by_url.len() >= ENDPOINTS {
                let oldest = self
                    .by_url
                    .iter()
                    .min_by_key(|(_, w)| w.used)
                    .map(|(u, _)| u.clone());
                if let Some(oldest) = oldest {
                    self.by_url.remove(&oldest);
                }
            }
            self.by_url.insert(url.to_string(), Window::default());
        }
        let w = self.by_url.get_mut(url).expect("inserted above");
        w.used = self.tick;
        w
    }

    /// `url` answered `status` to `member`'s request.
    pub(super) fn answered(&mut self, url: &str, member: Member, status: u16) {
        let w = self.window(url);
        if w.answers.len() == WINDOW {
            w.answers.pop_front();
        }
        w.answers.push_back((member, status));
        if (200..300).contains(&status) {
            // The messages that failed before this 2xx are theirs to blame.
            forget(&mut w.failed, member);
            forget(&mut w.proven, member);
            for m in std::mem::take(&mut w.failed) {
                remember(&mut w.proven, m);
            }
        } else if !w.proven.contains(&member) {
            remember(&mut w.failed, member);
        }
    }

    /// A batch in which `url` gave a 2xx to some request: its `failed` messages are proven
    /// at fault.
    pub(super) fn others_went_through(&mut self, url: &str, failed: &[Member]) {
        let w = self.window(url);
        for &m in failed {
            forget(&mut w.failed, m);
            remember(&mut w.proven, m);
        }
    }

    /// Whether every recent answer of `url` was `status`, to two messages or more, not all
    /// of them proven at fault.
    pub(super) fn every_request(&self, url: &str, status: u16) -> bool {
        let Some(w) = self.by_url.get(url) else {
            return false;
        };
        if w.answers.iter().any(|(_, s)| *s != status) {
            return false;
        }
        let mut members: Vec<Member> = w.answers.iter().map(|(m, _)| *m).collect();
        members.sort_unstable();
        members.dedup();
        members.len() >= 2 && members.iter().any(|m| !w.proven.contains(m))
    }

    /// Forgets the endpoints not in `keep` (after a reload changed the routes).
    pub(super) fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.by_url.retain(|url, _| keep(url));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const URL: &str = "http://hooks/";

    /// `URL`'s answers, in order: to each member, its status.
    fn answered(r: &mut Recent, answers: &[(Member, u16)]) {
        for &(m, status) in answers {
            r.answered(URL, m, status);
        }
    }

    /// `members` retried alone, each answered `status`, until the window holds nothing else.
    fn retried_alone(r: &mut Recent, members: &[Member], status: u16) {
        for _ in 0..WINDOW {
            for &m in members {
                r.answered(URL, m, status);
            }
        }
    }

    #[test]
    fn one_status_to_every_request_of_two_messages_is_the_endpoints() {
        let mut r = Recent::default();
        r.answered(URL, 1, 400);
        assert!(!r.every_request(URL, 400), "one message proves nothing");
        r.answered(URL, 1, 400);
        assert!(!r.every_request(URL, 400), "the same message again neither");
        r.answered(URL, 2, 400);
        assert!(r.every_request(URL, 400));
        assert!(!r.every_request(URL, 404), "another status");
        assert!(!r.every_request("http://other/", 400), "another endpoint");
    }

    #[test]
    fn a_2xx_in_the_window_makes_the_failures_the_messages() {
        let mut r = Recent::default();
        answered(&mut r, &[(1, 200), (2, 400), (3, 400)]);
        assert!(!r.every_request(URL, 400));
    }

    #[test]
    fn messages_proven_at_fault_stay_at_fault_when_retried_alone() {
        let mut r = Recent::default();
        // Two bad messages, then good ones: the bad ones failed before a 2xx.
        answered(&mut r, &[(1, 400), (2, 400)]);
        for good in 10..20 {
            r.answered(URL, good, 200);
        }
        retried_alone(&mut r, &[1, 2], 400);
        assert!(!r.every_request(URL, 400), "theirs, not the endpoint's");
        // A message not proven joins them: the endpoint may be failing everything now.
        r.answered(URL, 3, 400);
        assert!(r.every_request(URL, 400));
    }

    #[test]
    fn a_batch_with_a_2xx_proves_its_failures() {
        let mut r = Recent::default();
        answered(&mut r, &[(10, 200), (1, 400), (2, 400)]);
        r.others_went_through(URL, &[1, 2]);
        retried_alone(&mut r, &[1, 2], 400);
        assert!(!r.every_request(URL, 400));
    }

    #[test]
    fn a_confirmation_ends_what_a_message_is_remembered_for() {
        let mut r = Recent::default();
        answered(&mut r, &[(1, 400), (2, 200), (1, 200)]);
        retried_alone(&mut r, &[1, 3], 400);
        assert!(r.every_request(URL, 400), "1 is no longer proven at fault");
    }

    #[test]
    fn endpoints_are_bounded_and_forgotten_on_retain() {
        let mut r = Recent::default();
        for i in 0..ENDPOINTS + 10 {
            r.answered(&format!("http://h{i}/"), 1, 200);
        }
        assert_eq!(r.by_url.len(), ENDPOINTS);
        r.retain(|url| url == "http://h1030/");
        assert_eq!(r.by_url.len(), 1);
    }
}
