//! The async runtime the binary runs on: one worker thread on a host of two cores or fewer.

use std::num::NonZeroUsize;

/// The variable tokio reads for its worker count; when set it wins over the bridge's choice.
const WORKER_THREADS_VAR: &str = "TOKIO_WORKER_THREADS";

/// The worker threads to ask for, given the host's cores (as the process may use them: a
/// cgroup's CPU quota counts) and whether `TOKIO_WORKER_THREADS` is set: `None` leaves the
/// count to tokio (the variable, or one per core).
///
/// On two cores the bridge shares the host with at least its Redis client's work and, as
/// often as not, Redis, the broker or the endpoint themselves: a second worker thread then
/// only moves tasks between cores. Measured on 2 vCPUs (`bench --sink http`, five pairs),
/// one worker forwarded 8% more for 18% less CPU per message; RabbitMQ 2% more for 7% less,
/// with the same lateness.
fn worker_threads(cores: usize, variable_set: bool) -> Option<usize> {
    (!variable_set && cores <= 2).then_some(1)
}

/// The multi-threaded runtime with I/O and timers, sized by [`worker_threads`].
pub fn new_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let cores = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if let Some(n) = worker_threads(cores, std::env::var_os(WORKER_THREADS_VAR).is_some()) {
        builder.worker_threads(n);
    }
    builder.build()
}

#[cfg(test)]
mod tests {
    use super::worker_threads;

    #[test]
    fn small_hosts_get_one_worker_unless_the_variable_says_otherwise() {
        assert_eq!(worker_threads(1, false), Some(1));
        assert_eq!(worker_threads(2, false), Some(1));
        assert_eq!(worker_threads(3, false), None);
        assert_eq!(worker_threads(16, false), None);
        assert_eq!(worker_threads(2, true), None);
    }
}
