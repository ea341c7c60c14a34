//! Helpers shared by every test binary: the one place that decides whether a test whose
//! environment is incomplete (not root, no /dev/fuse, a tool or fixture missing) is skipped or
//! fails.
//!
//! Included as `mod mounts;` by tests/common/mod.rs, as `#[path = "mounts.rs"] mod mounts;` by
//! tests/common/run.rs and as `#[path = "common/mounts.rs"] mod mounts;` by the store tests.

#![allow(dead_code)] // each test binary uses a different subset of the helpers

/// Call where a test cannot run here, with the reason (e.g. "needs root and /dev/fuse").
/// Without `CI` in the environment: prints `skipped <test>: <reason>` and returns true (the
/// caller returns early, so the test counts as passed). With `CI` set: panics, because CI runs
/// as root with everything installed, and a skip there would hide a missing install step.
pub fn skip_or_fail(reason: &str) -> bool {
    let test = std::thread::current().name().unwrap_or("?").to_string();
    if std::env::var_os("CI").is_some() {
        panic!("{test}: {reason} (CI is set, so this is a failure, not a skip)");
    }
    eprintln!("skipped {test}: {reason}");
    true
}
