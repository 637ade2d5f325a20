//! The broker's answer to each publish on a shared channel, with a returned message matched to its publish by the publish's own number.
//!
//! RabbitMQ returns a mandatory message it could not route (`basic.return`) just before it
//! confirms it, and may confirm many messages in one multiple-ack. lapin hands a returned
//! message to whichever confirmation it resolves first after the return, which in a
//! multiple-ack is any of them: a message routed nowhere could read as confirmed (and leave
//! Redis unpublished) while a delivered one reads as returned. One collector per channel
//! reads every confirmation in the order the publishes were numbered, takes the returned
//! messages off them, and gives each back to the publish whose number it carries (the
//! `x-delay-publish` header, unique to each publish: two messages with the same message id
//! in flight at once are still told apart).
//!
//! The broker returns messages in the order they were published, and lapin pins each on the
//! next confirmation it resolves: once every publish up to a message was seen answered, its
//! return rode on one of them or on a confirmation resolved before, of a publish numbered
//! before that moment. A message is answered once every publish up to it was seen answered
//! and every publish numbered until then has been read again.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::FutureExt;
use lapin::message::BasicReturnMessage;
use lapin::publisher_confirm::{Confirmation, PublisherConfirm};
use lapin::ChannelState;
use tokio::sync::{mpsc, oneshot, Notify};

/// What the broker answered for one message.
pub(crate) type Answered = Result<Confirmation, lapin::Error>;

/// A publish as the collector learns of it, in the order of its delivery tag.
pub(super) struct Entry {
    /// The publish's number (its `x-delay-publish` header): a returned message is matched by
    /// it.
    pub id: u64,
    /// The publish's confirmation once lapin wrote its frames; `None` when it was refused
    /// before it was numbered; closed if it was abandoned in between.
    pub written: oneshot::Receiver<Option<PublisherConfirm>>,
    pub answer: oneshot::Sender<Answered>,
}

/// A number no other publish of this process carries: the `x-delay-publish` header.
pub(super) fn next_publish() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The publish number a returned message carries, if it has one.
fn publish_number(ret: &BasicReturnMessage) -> Option<u64> {
    let headers = ret.delivery.properties.headers().as_ref()?;
    match headers.inner().get(crate::wire::HEADER_PUBLISH)? {
        lapin::types::AMQPValue::LongLongInt(n) => u64::try_from(*n).ok(),
        _ => None,
    }
}

/// The broker's answer to one publish, from the channel's collector.
pub(crate) struct Answer(pub(super) oneshot::Receiver<Answered>);

impl Future for Answer {
    type Output = Answered;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Answered> {
        Pin::new(&mut self.0).poll(cx).map(|r| {
            // The collector ends only with its channel's publishers.
            r.unwrap_or(Err(lapin::Error::InvalidChannelState(ChannelState::Closed)))
        })
    }
}

enum State {
    /// Numbered, frames not yet written.
    Unwritten(oneshot::Receiver<Option<PublisherConfirm>>),
    /// Written, not yet answered.
    Waiting(PublisherConfirm),
    /// Answered (a return it carried taken off), when every publish numbered until then was
    /// seen: `horizon`, the last of them.
    Answered { raw: Answered, horizon: Option<u64> },
    /// Abandoned before its frames were written: whatever its confirmation carried is lost.
    Lost,
    /// Its answer was given.
    Done,
}

struct Pending {
    seq: u64,
    id: u64,
    state: State,
    answer: Option<oneshot::Sender<Answered>>,
}

/// The collector of one channel: runs until every publisher of the channel is gone and every
/// publish was answered.
pub(super) async fn collect(
    mut entries: mpsc::UnboundedReceiver<Entry>,
    written: Arc<Notify>,
    channel: lapin::Channel,
) {
    let mut c = Collector::default();
    let mut open = true;
    loop {
        if c.queue.is_empty() {
            c.returned.clear();
            match entries.recv().await {
                Some(e) => c.push(e),
                None => return,
            }
        }
        if c.settle_pass(&mut entries, &mut open) {
            // More may be ready at once; other tasks run meanwhile.
            tokio::task::yield_now().await;
        } else {
            let got = tokio::select! {
                _ = c.first_waiting() => None,
                _ = written.notified() => None,
                e = entries.recv(), if open => Some(e),
            };
            match got {
                Some(Some(e)) => c.push(e),
                Some(None) => open = false,
                None => {}
            }
        }
        if c.queue.is_empty() && (!open || c.first_lost.is_some()) {
            if c.first_lost.is_some() {
                // Retired (see `ConfirmChannel`): what is still published on it fails.
                let _ = channel.close(200, "a publish was abandoned").await;
            }
            return;
        }
    }
}

struct Collector {
    queue: VecDeque<Pending>,
    /// The last sequence number given.
    seq: u64,
    /// Returned messages taken off confirmations, by publish number, until their own publish is
    /// answered.
    returned: HashMap<u64, VecDeque<BasicReturnMessage>>,
    /// The first publish abandoned before its confirmation could be read: from then on, no
    /// confirmation without a return proves its message was routed.
    first_lost: Option<u64>,
    /// A confirmation was read resolved since the last full sweep.
    acked: bool,
    /// Publishes read answered, not yet given their answer.
    unanswered: usize,
    /// No publish before this sequence number is still unwritten.
    unwritten_from: u64,
}

impl Default for Collector {
    fn default() -> Self {
        Self {
            queue: VecDeque::new(),
            seq: 0,
            returned: HashMap::new(),
            first_lost: None,
            acked: false,
            unanswered: 0,
            unwritten_from: 1,
        }
    }
}

impl Collector {
    fn push(&mut self, e: Entry) {
        self.seq += 1;
        self.queue.push_back(Pending {
            seq: self.seq,
            id: e.id,
            state: State::Unwritten(e.written),
            answer: Some(e.answer),
        });
    }

    /// Takes in the new publishes, reads every confirmation already resolved, and answers
    /// what can be. True when something moved.
    fn settle_pass(
        &mut self,
        entries: &mut mpsc::UnboundedReceiver<Entry>,
        open: &mut bool,
    ) -> bool {
        let mut moved = false;
        // A confirmation seen resolved may have been preceded by one that carries its return
        // and was read still pending a moment earlier: once one was seen, every confirmation
        // owed is read again until a sweep finds nothing newly resolved, taken after every
        // publish numbered until then came in; only then is a horizon given.
        let mut full = std::mem::take(&mut self.acked);
        let mut settled = false;
        for _ in 0..8 {
            moved |= self.drain(entries, open);
            let (progress, resolved) = self.sweep(full);
            moved |= progress;
            if resolved {
                full = true;
                continue;
            }
            settled = true;
            break;
        }
        if !settled {
            // Read again on the next pass, which comes at once.
            self.acked = true;
            return true;
        }
        if full {
            // Only the publishes whose every predecessor was answered too: the broker returns
            // messages in the order they were published and lapin pins each on the next
            // confirmation it resolves, so once every publish up to this one was answered,
            // its return rode on one of them or on one resolved before, read by now.
            let newest = self.seq;
            for p in &mut self.queue {
                match &mut p.state {
                    State::Answered { horizon, .. } => {
                        horizon.get_or_insert(newest);
                    }
                    State::Unwritten(_) | State::Waiting(_) => break,
                    State::Lost | State::Done => {}
                }
            }
        }
        if self.unanswered > 0 {
            moved |= self.answer();
        }
        while self
            .queue
            .front()
            .is_some_and(|p| matches!(p.state, State::Done | State::Lost))
        {
            self.queue.pop_front();
        }
        moved
    }

    fn drain(&mut self, entries: &mut mpsc::UnboundedReceiver<Entry>, open: &mut bool) -> bool {
        let mut any = false;
        loop {
            match entries.try_recv() {
                Ok(e) => {
                    self.push(e);
                    any = true;
                }
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    *open = false;
                    return any;
                }
                Err(mpsc::error::TryRecvError::Empty) => return any,
            }
        }
    }

    /// Moves every publish as far as it goes without waiting; takes returned messages off
    /// the confirmations read. Says whether anything moved, and whether a confirmation was
    /// newly read.
    fn sweep(&mut self, full: bool) -> (bool, bool) {
        let (mut moved, mut resolved) = (false, false);
        // Only a full sweep reads what lies before the first publish still unwritten.
        let front = self.queue.front().map_or(self.seq + 1, |p| p.seq);
        let start = if full {
            0
        } else {
            self.unwritten_from.saturating_sub(front) as usize
        };
        for p in self.queue.range_mut(start.min(self.queue.len())..) {
            // A confirmation read pending before is read again only when the broker answered
            // since; one just written is read once at once.
            let mut read = full;
            loop {
                let next = match &mut p.state {
                    State::Unwritten(rx) => match rx.try_recv() {
                        Ok(Some(confirm)) => {
                            read = true;
                            State::Waiting(confirm)
                        }
                        // Refused before it was numbered: nobody waits for its answer.
                        Ok(None) => {
                            resolved = true;
                            State::Done
                        }
                        Err(oneshot::error::TryRecvError::Empty) => break,
                        Err(oneshot::error::TryRecvError::Closed) => {
                            resolved = true;
                            self.first_lost.get_or_insert(p.seq);
                            State::Lost
                        }
                    },
                    State::Waiting(_) if !read => break,
                    State::Waiting(confirm) => match confirm.now_or_never() {
                        Some(raw) => {
                            resolved = true;
                            self.unanswered += 1;
                            State::Answered {
                                raw: take_return(raw, &mut self.returned),
                                horizon: None,
                            }
                        }
                        None => break,
                    },
                    _ => break,
                };
                p.state = next;
                moved = true;
            }
        }
        while let Some(p) = self
            .unwritten_from
            .checked_sub(front)
            .and_then(|i| self.queue.get(i as usize))
        {
            if matches!(p.state, State::Unwritten(_)) {
                break;
            }
            self.unwritten_from += 1;
        }
        (moved, resolved)
    }

    /// Answers each publish whose confirmation was read and whose horizon was seen entirely.
    fn answer(&mut self) -> bool {
        let unwritten = self
            .queue
            .iter()
            .skip_while(|p| p.seq < self.unwritten_from)
            .find(|p| matches!(p.state, State::Unwritten(_)))
            .map(|p| p.seq);
        let lost = self.first_lost;
        let mut answered = false;
        for p in &mut self.queue {
            let State::Answered {
                horizon: Some(horizon),
                ..
            } = &p.state
            else {
                continue;
            };
            let horizon = *horizon;
            if unwritten.is_some_and(|u| u <= horizon) {
                continue;
            }
            let State::Answered { raw, .. } = std::mem::replace(&mut p.state, State::Done) else {
                unreachable!("matched above")
            };
            let returned = self.returned.get_mut(&p.id).and_then(VecDeque::pop_front);
            let answer = match (raw, returned) {
                (Ok(Confirmation::Ack(_)), Some(r)) => Ok(Confirmation::Ack(Some(Box::new(r)))),
                (Ok(Confirmation::Nack(_)), Some(r)) => Ok(Confirmation::Nack(Some(Box::new(r)))),
                // A confirmation abandoned unread may have carried this message's return.
                (Ok(Confirmation::Ack(None)), None) if lost.is_some_and(|l| l <= horizon) => {
                    Err(lapin::Error::InvalidChannelState(ChannelState::Error))
                }
                (raw, _) => raw,
            };
            if let Some(tx) = p.answer.take() {
                let _ = tx.send(answer);
            }
            self.unanswered -= 1;
            answered = true;
        }
        answered
    }

    /// Reads the first confirmation still owed once it resolves (never resolves when none
    /// is owed).
    async fn first_waiting(&mut self) {
        let Some(i) = self
            .queue
            .iter()
            .position(|p| matches!(p.state, State::Waiting(_)))
        else {
            return std::future::pending().await;
        };
        let raw = std::future::poll_fn(|cx| match &mut self.queue[i].state {
            State::Waiting(confirm) => Pin::new(confirm).poll(cx),
            _ => unreachable!("found waiting above"),
        })
        .await;
        self.queue[i].state = State::Answered {
            raw: take_return(raw, &mut self.returned),
            horizon: None,
        };
        self.acked = true;
        self.unanswered += 1;
    }
}

/// Takes the returned message off a confirmation into `returned`, by its publish number (one
/// without a number stays where lapin put it).
fn take_return(
    raw: Answered,
    returned: &mut HashMap<u64, VecDeque<BasicReturnMessage>>,
) -> Answered {
    let (ack, ret) = match raw {
        Ok(Confirmation::Ack(Some(r))) => (true, r),
        Ok(Confirmation::Nack(Some(r))) => (false, r),
        other => return other,
    };
    let answer = |ret| {
        Ok(if ack {
            Confirmation::Ack(ret)
        } else {
            Confirmation::Nack(ret)
        })
    };
    let Some(number) = publish_number(&ret) else {
        return answer(Some(ret));
    };
    returned.entry(number).or_default().push_back(*ret);
    answer(None)
}
