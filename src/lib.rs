//! layercache: immutable dependency-cache layers, keyed by lockfiles, mounted through a FUSE
//! copy-on-write overlay and promoted atomically after a successful setup.
//!
//! Module map, data flow of a run, on-disk format and invariants: docs/ARCHITECTURE.md.
//! [`overlay`] is the FUSE filesystem and knows nothing about keys; [`store`] is the on-disk
//! layer store, which mounts only through the overlay's daemon API ([`overlay::mount_daemon`],
//! [`overlay::unmount`]) and knows nothing of FUSE requests or of the CLI; [`app`] wires the
//! CLI ([`cli`]) to them.

#![warn(missing_docs)]
// The walls: `unsafe` lives in `sys` (the syscall wrappers), in `overlay` (the FUSE session and
// the fusermount3 handshake, to be narrowed) and where `run` and `sandbox` register `pre_exec`
// hooks (whose bodies call only `sys::forked`'s async-signal-safe wrappers) or a signal
// handler (`sys::catch_signal`). Every other module is refused it by the compiler.
#![deny(unsafe_code)]

// What the binary (main.rs) and the integration tests (tests/) use is public; everything else
// is the crate's own.
pub mod app;
pub mod cli;
mod error;
pub mod ids;
mod key;
#[allow(unsafe_code)]
pub mod overlay;
mod remote;
#[allow(unsafe_code)]
mod run;
#[allow(unsafe_code)]
mod sandbox;
mod serve;
mod spec;
pub mod store;
#[allow(unsafe_code)]
pub mod sys;
pub mod telemetry;
mod units;
mod why;

pub use error::{Error, Result};
