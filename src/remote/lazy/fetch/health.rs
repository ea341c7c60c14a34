//! Whether the remote answers, as one lazy layer's fetcher sees it (a circuit breaker).
//!
//! A fetch that got no answer until its bound ([`super::Limits::bound`]), while no other fetch
//! got a byte within that bound either, marks the remote down: from then on a fetch fails at once (its readers get `EIO` without waiting the bound
//! again), except one every [`PROBE_EVERY`], the probe, which asks the remote once (no
//! retries). Any answer (a probe's or a fetch's already in flight) marks it up again. A run
//! whose COMMAND opens N files of a layer whose remote hangs thus waits one bound, not N.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use crate::error::Error;

/// How often, while the remote is down, one fetch may ask it.
pub(super) const PROBE_EVERY: Duration = Duration::from_secs(5);

/// The remote's state for one fetcher (shared by its readers' threads and its tasks).
pub(super) struct Health {
    url: String,
    started: Instant,
    /// The bound after which a fetch gave up (for the message).
    bound: Duration,
    /// Milliseconds after `started` at which the remote was found down, plus 1; 0 while up.
    down_at: AtomicU64,
    /// Milliseconds after `started` at which the last probe started (or the remote was found
    /// down).
    probed_at: AtomicU64,
    /// Milliseconds after `started` at which a byte last arrived (any fetch's), plus 1; 0 for
    /// never.
    progress_at: AtomicU64,
}

impl Health {
    /// The remote at `url`, up, for fetches that give up after `bound`.
    pub(super) fn new(url: &str, bound: Duration) -> Health {
        Health {
            url: url.to_string(),
            started: Instant::now(),
            bound,
            down_at: AtomicU64::new(0),
            probed_at: AtomicU64::new(0),
            progress_at: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Whether the remote is down (a fetch gave up and nothing answered since).
    pub(super) fn is_down(&self) -> bool {
        self.down_at.load(Relaxed) != 0
    }

    /// Whether a probe may start now (the remote is down and [`PROBE_EVERY`] has passed since
    /// the last one): a caller that may wait for it (background completion) waits while this
    /// and [`Health::is_down`] say no.
    pub(super) fn probe_due(&self) -> bool {
        self.now_ms() >= self.probed_at.load(Relaxed) + PROBE_EVERY.as_millis() as u64
    }

    /// Whether the caller may send a request now: always while the remote is up; while it is
    /// down, only the first caller after [`PROBE_EVERY`] (whose request is the probe).
    pub(super) fn may_try(&self) -> bool {
        if !self.is_down() {
            return true;
        }
        let last = self.probed_at.load(Relaxed);
        let now = self.now_ms();
        now >= last + PROBE_EVERY.as_millis() as u64
            && (self.probed_at)
                .compare_exchange(last, now, Relaxed, Relaxed)
                .is_ok()
    }

    /// Bytes of some fetch arrived: the remote answers (a fetch that gives up now, stalled
    /// alone, does not make it down).
    pub(super) fn progressed(&self) {
        self.progress_at.fetch_max(self.now_ms() + 1, Relaxed);
    }

    /// A fetch gave up without an answer: the remote is down (its time is kept when it was
    /// down already) — unless bytes of another fetch arrived within the bound (a busy server
    /// or link that stalled one transfer is not a remote that stopped answering).
    pub(super) fn gave_up(&self) {
        let now = self.now_ms();
        let progress = self.progress_at.load(Relaxed);
        if progress != 0 && now < progress - 1 + self.bound.as_millis() as u64 {
            return;
        }
        if self
            .down_at
            .compare_exchange(0, now + 1, Relaxed, Relaxed)
            .is_ok()
        {
            self.probed_at.store(now, Relaxed);
            tracing::warn!(
                url = %self.url,
                at_ms = now,
                "lazy fetch: the remote did not answer; fetches fail at once until a probe \
                 (one every {} s) gets an answer",
                PROBE_EVERY.as_secs()
            );
        }
    }

    /// The remote answered (with bytes or an error of its own): it is up.
    pub(super) fn answered(&self) {
        if self.down_at.swap(0, Relaxed) != 0 {
            tracing::info!(url = %self.url, at_ms = self.now_ms(), "lazy fetch: the remote answers again");
        }
    }

    /// The error of a fetch not sent because the remote is down
    /// ([`super::super::super::RemoteError::Unanswered`]).
    pub(super) fn down_error(&self) -> Error {
        let at = self.down_at.load(Relaxed).saturating_sub(1);
        super::super::super::RemoteError::Unanswered {
            url: self.url.clone(),
            bound_secs: self.bound.as_secs_f64(),
            at_secs: at as f64 / 1000.0,
            probe_secs: PROBE_EVERY.as_secs(),
        }
        .into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::RemoteKind;

    #[test]
    fn a_down_remote_is_asked_by_one_probe_per_period_and_is_up_after_an_answer() {
        let h = Health::new("s3://b/p", Duration::from_secs(3));
        assert!(h.may_try() && h.may_try(), "up: every caller asks");
        h.gave_up();
        assert!(h.is_down());
        assert!(!h.may_try(), "down: no caller asks before the probe period");
        // As if the period had passed: one caller (the probe), not two.
        h.probed_at.store(0, Relaxed);
        let h = {
            let mut h = h;
            h.started -= PROBE_EVERY;
            h
        };
        assert!(h.probe_due());
        assert!(h.may_try());
        assert!(
            !h.may_try(),
            "the second caller after the period does not ask"
        );
        let e = h.down_error();
        let said = e.to_string();
        assert!(
            said.starts_with("remote s3://b/p: not asked: no answer within 3 s at ")
                && said.ends_with("(one fetch every 5 s asks again)"),
            "{said}"
        );
        assert!(
            matches!(
                e,
                Error::Remote {
                    kind: RemoteKind::Unreachable,
                    ..
                }
            ),
            "{e:?}"
        );
        h.answered();
        assert!(!h.is_down() && h.may_try());
    }

    #[test]
    fn a_fetch_that_gives_up_while_others_make_progress_does_not_make_the_remote_down() {
        let h = Health::new("s3://b/p", Duration::from_secs(3));
        h.progressed();
        h.gave_up();
        assert!(!h.is_down(), "bytes arrived within the bound");
        // The last byte longer ago than the bound: down.
        let mut h = h;
        h.started -= Duration::from_secs(4);
        h.gave_up();
        assert!(h.is_down());
    }
}
