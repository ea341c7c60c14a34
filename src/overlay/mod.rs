//! The FUSE copy-on-write overlay: a merged view of read-only lower directories and one
//! writable upper directory with kernel-overlayfs semantics (Documentation/filesystems/
//! overlayfs.rst), plus directory renames of lower directories (no EXDEV).
//!
//! This module knows nothing about keys or the store. Entry points:
//! * [`cli_overlay`] — `layercache overlay -o … MOUNTPOINT [-f]`;
//! * [`mount_daemon`] — mount and fork a serving daemon, return once the mount is ready;
//! * [`unmount`] — unmount a mountpoint and wait for its daemon to finish.
//!
//! Without root, mounts go through `fusermount3` (see [`fusermount`]); root of a user
//! namespace mounts with mount(2) like root. Only what needs `CAP_SYS_ADMIN` in the initial
//! user namespace (passthrough, the `enable_uring` and readahead knobs in sysfs, `trusted.*`
//! xattrs) checks for it ([`crate::sys::init_ns_admin`]) and falls back silently, except an
//! explicit `-o passthrough`, which is refused.

mod daemon;
mod dir;
pub mod errno;
mod fdcache;
mod fs;
pub mod fusermount;
mod inode;
mod kernel;
mod layer;
pub mod links;
mod mount;
mod names;
mod node_data;
mod node_index;
mod open_trace;
pub mod options;
mod passthrough;
mod policy;
mod privs;
mod removed;
mod ring;
pub mod stack;
pub mod warm;
pub mod whiteout;

pub use daemon::{DaemonFailure, cli_daemon, cli_overlay, mount_daemon, mount_foreground};
pub use layer::{
    Layer, LayerDir, LayerMaker, LowerData, ReadGate, on_daemon_exit, set_layer_maker,
};
pub use mount::{is_mountpoint_busy, unmount, upperdir_of, wait_pidfd};
pub use options::OverlayConfig;

/// Readahead window of a layercache mount, in KiB (2 MiB): a sequential reader then gets 1 MiB
/// FUSE READs (the mount's max_pages is 256) instead of 128 KiB ones, an eighth of the round
/// trips, two of them in flight per window so the daemon's threads overlap the reader (spread
/// threads, see `ring.rs`). Larger windows gained little for a first pass and looked slower for
/// a cold read, where more concurrent READs interleave on the lower file; the measurements are
/// in benches/results/2026-11-29-bench-quick-seqread-bc09e50.md.
const READ_AHEAD_KB: u64 = 2048;
