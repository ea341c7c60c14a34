//! Files likely to be mapped with mmap(2) (`.node`, `.so`, `.so.1.2`, `.jar`), fetched before
//! COMMAND starts: a page fault whose piece cannot be had is SIGBUS to the mapping's reader,
//! where a read(2) would get EIO and a message. Only when the key has a trace (the files the
//! last run opened): without one nothing says which of a tree's mapped files a run needs (a
//! venv holds hundreds of `.so`), and fetching some at random would delay COMMAND for bytes it
//! may never touch.
//!
//! * The daemon ([`super::make_layer`]) picks the traced files with such names, in trace
//!   order, whose objects are not local, up to [`PREFETCH_BYTES`]; once the object table is
//!   here it fetches them as demand reads do (starting at once, stored right after what a
//!   reader waits for, verified before anything is visible; no trace replay unit starts
//!   meanwhile), at most [`PREFETCH_UNITS`] GETs at once, until they are all local or the
//!   budget's time is over ([`prefetch_deadline`]: [`prefetch_wait`] after the run's start,
//!   handed to the daemon as the milliseconds left, [`super::LazySpec::prefetch_ms`]); then
//!   it writes [`PREFETCHED`] in the run's directory. What has not arrived by then goes on
//!   arriving (the trace replay follows). A remote the fetcher found down, an object table that came after
//!   the budget or none at all, or files that could not arrive in time at the rate the run's
//!   manifest GET came at ([`too_slow`], decided as the daemon starts) or the object table
//!   came at ([`RATE_SAMPLE`]): nothing is fetched first, [`PREFETCHED`] says why at once
//!   (the run waits no longer).
//! * The run ([`wait_prefetched`]) waits for [`PREFETCHED`] before its first step (maintenance
//!   or COMMAND), at most until [`prefetch_deadline`]: a daemon that is late or a remote that
//!   hangs costs the run that wait, never more, and never fails it; a run whose mounts took
//!   the whole budget does not wait at all.

use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// `lazy-prefetched.json` in the run's directory: what the daemon fetched before COMMAND
/// ([`Prefetched`]), written once when that ended.
pub const PREFETCHED: &str = "lazy-prefetched.json";

/// Bytes of likely-mmapped files fetched before COMMAND at most: 4 MiB is 0.17 s at the
/// 200 Mbit/s of the benchmark's link, so what the budget starts mostly arrives within its
/// time ([`DEFAULT_WAIT`]) and little is left competing with COMMAND's own reads afterwards
/// (16 MiB would be 0.7 s of link: over the 300 ms to COMMAND start the lazy mount targets).
/// It holds the native modules a Node.js run loads (rollup's `.node` is 2.6 MB) and the
/// handful of `.so` an import of a small extension module maps; a bigger set comes through
/// the trace replay as before.
pub const PREFETCH_BYTES: u64 = 4 << 20;

/// Bytes a manifest must have for its GET's time to tell the link's rate (at least:
/// the time includes the request's delay); the prefetch skips what that rate could not bring
/// before the deadline, so the run does not wait for nothing.
pub const RATE_SAMPLE: u64 = 256 << 10;

/// Why a prefetch of objects of `sizes` (bytes, in trace order; as many as fit in
/// [`PREFETCH_BYTES`], as [`super::fetch::Shared::prefetch`] picks them, whether local or not)
/// could not arrive within `wait` at `rate` (bytes per second the link gave the run's manifest
/// GET, at least), or `None` when it might (or the rate is not known): the daemon then skips
/// it at once, before the object table comes, and the run does not wait for nothing.
pub fn too_slow(sizes: &[u64], rate: Option<u64>, wait: Duration) -> Option<String> {
    let mut wanted = 0u64;
    for &size in sizes {
        if wanted + size <= PREFETCH_BYTES {
            wanted += size;
        }
    }
    slower_than(wanted, rate?, wait, "the manifest")
}

/// Why `wanted` bytes could not arrive within `left` at `rate` (bytes per second, at least,
/// that `what` came at), or `None` when they might (or the rate is 0: unknown).
pub(super) fn slower_than(wanted: u64, rate: u64, left: Duration, what: &str) -> Option<String> {
    if rate == 0 {
        return None;
    }
    let takes = Duration::from_secs_f64(wanted as f64 / rate as f64);
    (takes > left).then(|| {
        format!(
            "{} would take {} ms at the {}/s {what} came at; {} ms left",
            crate::units::fmt_bytes(wanted),
            takes.as_millis(),
            crate::units::fmt_bytes(rate),
            left.as_millis()
        )
    })
}

/// The longest [`prefetch_wait`] accepted: 10 s (it delays COMMAND's start; `250`, meant as
/// the default's milliseconds, is 250 seconds and refused).
pub const MAX_WAIT: Duration = Duration::from_secs(10);

/// GETs of the prefetch in flight at most.
pub const PREFETCH_UNITS: usize = 6;

/// How long after the run's start its first step may wait for the prefetch by default:
/// 250 ms, so that COMMAND (which starts ~20-30 ms after the wait: the views, the summary,
/// the exec) keeps within the lazy mount's target of 300 ms at 200 Mbit/s + 20 ms per
/// response. Measured on the npm benchmark's layer (10k files) on a loaded 2-core machine:
/// the mount is up 100-200 ms after the run's start, its daemon has the object table 90-140
/// ms after its own start (two GETs: the compact manifest, then the piece table), and
/// rollup's 2.2 MB `.node` takes another ~130 ms: in at ~270 ms at best, so there it often
/// does not make it; a few hundred KiB of `.so` does.
pub const DEFAULT_WAIT: Duration = Duration::from_millis(250);

/// When the run started ([`start_clock`]).
static RUN_START: OnceLock<Instant> = OnceLock::new();

/// Records now as the run's start, the time [`prefetch_deadline`] counts from (the first
/// call counts; a process that never calls it counts from its first [`prefetch_deadline`]).
pub fn start_clock() {
    RUN_START.get_or_init(Instant::now);
}

/// Until when the run waits for its lazy mounts' prefetch at the latest: [`prefetch_wait`]
/// after the run's start ([`start_clock`]).
pub fn prefetch_deadline() -> Instant {
    let start = *RUN_START.get_or_init(Instant::now);
    start + prefetch_wait().unwrap_or(DEFAULT_WAIT)
}

/// `LAYERCACHE_LAZY_PREFETCH`: how long after the run's start its first step (maintenance or
/// COMMAND) may wait for the files likely to be mmapped that its lazy mounts' traces name
/// ([`DEFAULT_WAIT`] when unset; `0` fetches nothing first): a number of seconds (`0.3`) or one
/// with a unit `ms`, `s`, `m` or `h` (`300ms`), at most [`MAX_WAIT`] (10 s).
///
/// Errors: [`crate::error::Error::Invalid`] naming the variable, its value and what is valid
/// (checked by the run before it mounts anything; the daemons only read it).
pub fn prefetch_wait() -> crate::error::Result<Duration> {
    match std::env::var("LAYERCACHE_LAZY_PREFETCH") {
        Ok(v) => parse_wait(&v),
        Err(_) => Ok(DEFAULT_WAIT),
    }
}

/// [`prefetch_wait`] of the value `v`: the lazy timeout's grammar ([`super::parse_seconds`]),
/// 0 included, at most [`MAX_WAIT`].
fn parse_wait(v: &str) -> crate::error::Result<Duration> {
    super::parse_seconds(v)
        .filter(|d| *d <= MAX_WAIT)
        .ok_or_else(|| {
            crate::error::Error::invalid(format!(
                "LAYERCACHE_LAZY_PREFETCH={v:?}: want a number of seconds (0.25) or one with a \
                 unit ms, s, m or h (250ms), at most 10s: COMMAND waits for it (0: fetch \
                 nothing before COMMAND)"
            ))
        })
}

/// Whether a file named `name` (its last path component or its whole path) is likely to be
/// mapped with mmap(2) by the program that opens it: a Node.js native module (`.node`), a
/// shared library (`.so`, or versioned: `.so.1`, `.so.1.2.3`), a Java archive (`.jar`).
pub fn likely_mmapped(name: &[u8]) -> bool {
    let base = name.rsplit(|&b| b == b'/').next().unwrap_or(name);
    let stem = [&b".node"[..], b".jar", b".so"]
        .iter()
        .find_map(|s| base.strip_suffix(*s));
    if let Some(stem) = stem {
        return !stem.is_empty();
    }
    // `libfoo.so.1.2`: ".so." then digits and dots only.
    let Some(at) = base.windows(4).rposition(|w| w == b".so.") else {
        return false;
    };
    let version = &base[at + 4..];
    at > 0
        && version.first().is_some_and(u8::is_ascii_digit)
        && version.iter().all(|&b| b.is_ascii_digit() || b == b'.')
}

/// What a lazy layer's daemon fetched before COMMAND ([`PREFETCHED`]).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Prefetched {
    /// Objects of likely-mmapped traced files local when the prefetch ended (fetched by it,
    /// or by a reader meanwhile).
    pub objects: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Objects it set out to fetch (within [`PREFETCH_BYTES`]).
    pub wanted_objects: u64,
    /// Their bytes.
    pub wanted_bytes: u64,
    /// Milliseconds from the daemon's start to the prefetch's end.
    pub ms: u64,
    /// Why nothing was fetched first, if so (no such traced file, the remote was down, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
}

impl Prefetched {
    /// Nothing fetched first, because of `why`, `ms` after the daemon started.
    pub fn skipped(why: &str, ms: u64) -> Prefetched {
        Prefetched {
            ms,
            skipped: Some(why.to_string()),
            ..Default::default()
        }
    }
}

/// Waits until the daemon of the lazy mount whose run directory is `run_dir` has written
/// [`PREFETCHED`], or until `deadline`; returns what it says (`None` when it is not there
/// by then or does not parse: the run goes on).
pub fn wait_prefetched(run_dir: &Path, deadline: Instant) -> Option<Prefetched> {
    let path = run_dir.join(PREFETCHED);
    loop {
        if let Ok(b) = std::fs::read(&path) {
            return serde_json::from_slice(&b).ok();
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        std::thread::sleep((deadline - now).min(Duration::from_millis(2)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefetch_the_manifests_rate_could_not_bring_in_time_is_skipped_at_once() {
        let ms = Duration::from_millis;
        // 2 MiB at 12.5 MiB/s: 160 ms.
        let rate = Some(25 << 19);
        let why = too_slow(&[2 << 20], rate, ms(150)).expect("too slow");
        assert_eq!(
            why,
            "2.0 MiB would take 160 ms at the 12.5 MiB/s the manifest came at; 150 ms left"
        );
        assert_eq!(too_slow(&[2 << 20], rate, ms(170)), None);
        assert_eq!(too_slow(&[2 << 20], None, ms(1)), None, "rate unknown");
        // Only what fits the byte budget counts, as the prefetch picks it.
        assert_eq!(too_slow(&[PREFETCH_BYTES, 2 << 20], rate, ms(330)), None);
        assert!(too_slow(&[PREFETCH_BYTES, 1], rate, ms(319)).is_some());
    }

    #[test]
    fn mapped_libraries_modules_and_archives_are_told_by_name() {
        for yes in [
            "lib/libx.so.1",
            "libfoo.so.1.2.3",
            "a/b/libc.so",
            "node_modules/@rollup/rollup-linux-x64-gnu/rollup.linux-x64-gnu.node",
            "x.jar",
            "numpy/core/_multiarray_umath.cpython-312-x86_64-linux-gnu.so",
        ] {
            assert!(likely_mmapped(yes.as_bytes()), "{yes}");
        }
        for no in [
            "index.js",
            "lib/libx.so.txt",
            "lib/libx.so.",
            "a/.so",
            ".node",
            "so",
            "libx.sox",
            "a.node.js",
            "lib.so.d/readme",
            "foo.dylib",
            "x.jar.sha1",
        ] {
            assert!(!likely_mmapped(no.as_bytes()), "{no}");
        }
    }

    #[test]
    fn the_prefetch_wait_takes_seconds_or_a_duration_and_names_a_bad_value() {
        assert_eq!(parse_wait("0.3").unwrap(), Duration::from_millis(300));
        assert_eq!(parse_wait("300ms").unwrap(), Duration::from_millis(300));
        assert_eq!(parse_wait("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_wait("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_wait("10").unwrap(), MAX_WAIT);
        for bad in [
            "-1", "soon", "", "NaN", "2h", "1e3", " 1", "0.3 s", "250", "10.5",
        ] {
            let e = parse_wait(bad).unwrap_err().to_string();
            assert!(e.contains("LAYERCACHE_LAZY_PREFETCH"), "{bad}: {e}");
        }
    }
}
