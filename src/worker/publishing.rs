//! A publisher kept while it is usable, asked of the sink again when it is not.

use tokio_util::sync::CancellationToken;

use crate::config::Destination;
use crate::repeat::Repeated;
use crate::sink::{PublishError, Publisher, Sink};

/// A publisher kept while it is usable and asked of the sink again when it is not, with
/// the current run of failures to get one.
#[derive(Default)]
pub(crate) struct Publishing {
    pub(crate) current: Option<Publisher>,
    /// The current run of failures to get one.
    pub(crate) failures: Repeated,
}

impl Publishing {
    /// The usable publisher, or a new one for `destination`: `Ok(None)` when `stop` fired
    /// first, `Err` when the sink could not give one (the caller counts it in `failures`).
    pub(crate) async fn get(
        &mut self,
        sink: &Sink,
        destination: &Destination,
        stop: &CancellationToken,
    ) -> Result<Option<Publisher>, PublishError> {
        if let Some(p) = self.current.as_ref().filter(|p| p.is_usable()) {
            return Ok(Some(p.clone()));
        }
        self.current = None;
        let p = tokio::select! {
            p = sink.publisher(destination) => p?,
            _ = stop.cancelled() => return Ok(None),
        };
        self.failures.recovered();
        self.current = Some(p.clone());
        Ok(Some(p))
    }

    /// Retires the current publisher after its destination failed in full again on a
    /// connection that stayed up (see [`Publisher::retire`]), so that the next one is fresh;
    /// true when there was one to renew.
    pub(crate) async fn retire(&mut self) -> bool {
        let Some(p) = &self.current else {
            return false;
        };
        let renewed = p.retire().await;
        if renewed {
            self.current = None;
        }
        renewed
    }
}
