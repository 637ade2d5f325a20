//! The messages RabbitMQ refused alone, remembered for an hour so that a retry alone is
//! still judged as the message's fault.

/// The messages the broker refused alone while others went through, by message id, for an
/// hour: when such a message is retried alone (nothing else due to tell), it is still its
/// own fault, not the sink's. Bounded: the oldest are forgotten first.
#[derive(Default)]
pub(crate) struct Refused {
    ids: std::sync::Mutex<std::collections::VecDeque<(String, tokio::time::Instant)>>,
}

impl Refused {
    const KEEP: std::time::Duration = std::time::Duration::from_secs(3600);
    const MOST: usize = 10_000;

    pub(super) fn remember(&self, id: &str) {
        let mut ids = self.ids.lock().unwrap_or_else(|e| e.into_inner());
        if ids.len() >= Self::MOST {
            ids.pop_front();
        }
        ids.push_back((id.to_string(), tokio::time::Instant::now()));
    }

    pub(super) fn was_refused(&self, id: &str) -> bool {
        let mut ids = self.ids.lock().unwrap_or_else(|e| e.into_inner());
        while ids.front().is_some_and(|(_, at)| at.elapsed() > Self::KEEP) {
            ids.pop_front();
        }
        ids.iter().any(|(known, _)| known == id)
    }
}
