//! A sleep to the microsecond for the head's due time: tokio's timers round a deadline up
//! to their next millisecond tick.

use std::time::Duration;

use tokio::time::Instant;

/// Below this much before the deadline, the wait is left to a timer of its own.
const FINE: Duration = Duration::from_millis(1);

/// Sleeps until `deadline`: tokio's timer to within [`FINE`] of it, then a one-shot kernel
/// timer for the rest (a high-resolution timer, woken through tokio's reactor), so that a
/// head's claim does not start up to a millisecond after the head is due. Where no such
/// timer can be had, tokio's alone.
pub(super) async fn sleep_until(deadline: Instant) {
    if let Some(coarse) = deadline.checked_sub(FINE) {
        tokio::time::sleep_until(coarse).await;
    }
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return;
    }
    #[cfg(target_os = "linux")]
    if fine::sleep(left).await.is_ok() {
        return;
    }
    tokio::time::sleep_until(deadline).await;
}

/// Sleeps until the head is due (to the microsecond) or until `guard` (tokio's timer: a
/// guard needs no precision, and an idle trigger no kernel timer), whichever comes first.
pub(super) async fn head_or_guard(head: Option<Instant>, guard: Instant) {
    match head.filter(|due| *due < guard) {
        Some(due) => sleep_until(due).await,
        None => tokio::time::sleep_until(guard).await,
    }
}

#[cfg(target_os = "linux")]
mod fine {
    //! The one-shot timerfd.

    use std::os::fd::OwnedFd;
    use std::time::Duration;

    use rustix::time::{
        timerfd_create, timerfd_settime, Itimerspec, TimerfdClockId, TimerfdFlags,
        TimerfdTimerFlags, Timespec,
    };
    use tokio::io::unix::AsyncFd;
    use tokio::io::Interest;

    /// Sleeps `left` (more than zero) on a timerfd of the monotonic clock, the clock of
    /// tokio's `Instant`.
    pub(super) async fn sleep(left: Duration) -> std::io::Result<()> {
        let fd = timerfd_create(
            TimerfdClockId::Monotonic,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )?;
        let once = Itimerspec {
            it_interval: Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            // A zero value would disarm the timer: at least a nanosecond.
            it_value: Timespec {
                tv_sec: i64::try_from(left.as_secs()).unwrap_or(i64::MAX),
                tv_nsec: i64::from(left.subsec_nanos().max(1)),
            },
        };
        timerfd_settime(&fd, TimerfdTimerFlags::empty(), &once)?;
        // SAFETY: the `OwnedFd` is a valid open timerfd, owned by the `AsyncFd` from here
        // until it is dropped, and never replaced or closed meanwhile.
        let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }?;
        loop {
            let mut ready = fd.readable().await?;
            let mut expirations = [0u8; 8];
            match ready.try_io(|fd: &AsyncFd<OwnedFd>| {
                rustix::io::read(fd.get_ref(), &mut expirations).map_err(std::io::Error::from)
            }) {
                Ok(result) => return result.map(|_| ()),
                // Not expired yet (a spurious readiness): wait again.
                Err(_would_block) => continue,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn it_never_wakes_before_the_deadline() {
        for k in 0..20u64 {
            let deadline = Instant::now() + Duration::from_micros(137 * k);
            sleep_until(deadline).await;
            let woke = Instant::now();
            assert!(woke >= deadline, "woke {:?} early", deadline - woke);
        }
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn the_kernel_timer_is_armed_and_fires() {
        let start = Instant::now();
        fine::sleep(Duration::from_micros(300))
            .await
            .expect("a timerfd on the monotonic clock");
        assert!(start.elapsed() >= Duration::from_micros(300));
    }
}
