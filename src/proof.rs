//! The proof that a sink confirmed a message: the only thing that lets a settle call delete it.

/// Proof that the broker or endpoint confirmed one message. Only the sinks make one
/// (`tests/it/architecture.rs` fails if another module calls [`Confirmed::by_broker`]), and
/// the settle call that deletes a member takes it by value (`Settlement::ack`): nothing else
/// removes a member from Redis as delivered. It is not `Copy`: the one clone is the sinks',
/// where a confirmation is both reported at once (for an early settle) and kept as the
/// message's result (for the final settle, should the early one fail).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confirmed(());

impl Confirmed {
    /// The broker has the message: an AMQP ack without a return, a Kafka delivery report, a
    /// 2xx answer. Called by the sinks only.
    pub(crate) fn by_broker() -> Self {
        Self(())
    }

    /// A proof for a member nothing published: only for measuring what the scripts alone
    /// can do (the benchmark's Redis ceiling) and for the scripts' model test, never for
    /// delivery. Built only with the `bench-hooks` feature, which the daemon's builds leave
    /// out.
    #[cfg(feature = "bench-hooks")]
    pub fn unpublished() -> Self {
        Self(())
    }

    /// A confirmation for unit tests of code that consumes outcomes.
    #[cfg(test)]
    pub(crate) fn for_tests() -> Self {
        Self(())
    }
}
