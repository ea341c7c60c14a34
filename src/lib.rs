//! layercache: immutable dependency-cache layers, keyed by lockfiles, mounted through a FUSE
//! copy-on-write overlay and promoted atomically after a successful setup.
//!
//! Module map, data flow of a run, on-disk format and invariants: docs/ARCHITECTURE.md.
//! [`overlay`] is the FUSE filesystem and knows nothing about keys; [`store`] is the on-disk
//! layer store, which mounts only through the overlay's daemon API ([`overlay::mount_daemon`],
//! [`overlay::unmount`]) and knows nothing of FUSE requests or of the CLI; [`app`] wires the
//! CLI ([`cli`]) to them.

#![warn(missing_docs)]

pub mod app;
pub mod cli;
pub mod error;
pub mod ids;
pub mod key;
pub mod overlay;
pub mod remote;
pub mod run;
pub mod sandbox;
pub mod serve;
pub mod spec;
pub mod store;
pub mod sys;
pub mod telemetry;
pub mod units;
pub mod why;

pub use error::{Error, Result};
