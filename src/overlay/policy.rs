//! The policy part of the overlay engine: what the mount's options decide for every request —
//! read-only (every change is `EROFS`), `strictatime` (every read reaches the upper file), the
//! ownership a run as another user sees (`squash_to_uid`/`squash_to_gid`), and how each lower
//! shows its hard links (`links.rs`). Fixed at mount; private fields, read through methods.

use fuser::{FileAttr, FopenFlags};

use super::links::Links;
use super::options::Squash;

/// The mount's fixed choices (see the module docs).
pub struct MountPolicy {
    squash: Squash,
    read_only: bool,
    strict_atime: bool,
    /// How each lower shows its hard links, in layer order.
    links: Vec<Links>,
}

impl MountPolicy {
    /// The policy of a mount: ownership mapping `squash`, `read_only`, `strict_atime` (the
    /// mount is `strictatime` and not read-only), and each lower's `links`, top first.
    pub fn new(
        squash: Squash,
        read_only: bool,
        strict_atime: bool,
        links: Vec<Links>,
    ) -> MountPolicy {
        MountPolicy {
            squash,
            read_only,
            strict_atime,
            links,
        }
    }

    /// A read-only mount (`OverlayConfig::read_only`): every change is answered `EROFS`.
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// The mount is `strictatime` and not read-only: every read must reach the upper file, so
    /// cached opens do not keep the page cache (`FOPEN_KEEP_CACHE`) and no-open mode is off —
    /// a read served from the page cache reaches no daemon, and FUSE inodes never get an atime
    /// update from the kernel itself (fs/fuse/inode.c `fuse_iget` sets `S_NOATIME`).
    pub fn strict_atime(&self) -> bool {
        self.strict_atime
    }

    /// The flags of a cached (not passthrough) open: the page cache is kept across opens
    /// (`FOPEN_KEEP_CACHE`), except under `strictatime`, where each open drops it so that a
    /// reader's first read reaches the daemon and updates the upper file's atime; no open
    /// has anything to flush (`FOPEN_NOFLUSH`).
    pub fn cached_open_flags(&self) -> FopenFlags {
        if self.strict_atime {
            FopenFlags::FOPEN_NOFLUSH
        } else {
            FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_NOFLUSH
        }
    }

    /// Whether the mount maps ownership (`squash_to_uid` or `squash_to_gid` set).
    pub fn squashes(&self) -> bool {
        self.squash.is_set()
    }

    /// The group a file with group `gid` shows (the `squash_to_gid`, or `gid`).
    pub fn shown_gid(&self, gid: u32) -> u32 {
        self.squash.gid.unwrap_or(gid)
    }

    /// `attr` with the owner the mount reports.
    pub fn squashed(&self, mut attr: FileAttr) -> FileAttr {
        if let Some(u) = self.squash.uid {
            attr.uid = u;
        }
        if let Some(g) = self.squash.gid {
            attr.gid = g;
        }
        attr
    }

    /// How lower `layer` (0 = topmost) shows its hard links; `None` past the last lower.
    pub fn links(&self, layer: u8) -> Option<&Links> {
        self.links.get(layer as usize)
    }
}
