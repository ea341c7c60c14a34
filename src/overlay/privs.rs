//! Dropping the set-user-ID and set-group-ID bits of a file its content changes through, as
//! the kernel does for a local filesystem (fs/attr.c, `setattr_should_drop_suidgid` and
//! `setattr_should_drop_sgid`; xfstests generic/683-687).
//!
//! The daemon writes as root, so its own writes to the upper file never drop them, and the
//! FUSE kernel module's part (fs/fuse/dir.c, `fuse_setattr` without `FUSE_HANDLE_KILLPRIV`)
//! is partial: it clears S_ISUID, and S_ISGID only with group-execute. So a WRITE, FALLOCATE,
//! COPY_FILE_RANGE or size-changing SETATTR from a caller without `CAP_FSETID` ends with the
//! kernel's full rule applied here: S_ISUID goes; S_ISGID goes when the file is group-executable
//! or the caller is not in the file's group. The kernel's own SETATTR for that (sent before the
//! change, from `file_remove_privs`) is completed the same way, so the attributes it caches from
//! the reply are right: a SETATTR that keeps S_ISGID from a caller neither in the file's group
//! nor holding CAP_FSETID loses it (a chmod(2) by such a caller reaches the daemon without it
//! anyway, fs/attr.c `setattr_prepare`).
//!
//! Setting a POSIX access ACL drops S_ISGID when the caller is neither in the file's group nor
//! holds CAP_FSETID (fs/posix_acl.c, `posix_acl_update_mode`; xfstests generic/375): the
//! kernel tells the daemon with FUSE_SETXATTR_ACL_KILL_SGID, which fuser does not pass on, and
//! the daemon's own setxattr as root keeps the bit, so that rule is applied here too.

use std::fs::File;

/// Who sent a request: the FUSE header's uid, gid (the caller's fsuid/fsgid) and pid (0 when
/// the caller is outside the daemon's pid namespace).
#[derive(Clone, Copy, Debug)]
pub struct Caller {
    /// fsuid.
    pub uid: u32,
    /// fsgid.
    pub gid: u32,
    /// Thread group id, or 0.
    pub pid: u32,
}

/// What the daemon can learn of a caller's credentials from /proc/PID/status.
struct Creds {
    /// `CAP_FSETID` in its effective set, in the daemon's user namespace.
    fsetid: bool,
    /// Supplementary groups.
    groups: Vec<u32>,
}

const CAP_FSETID: u32 = 4;

/// The credentials of `caller` from /proc; when they cannot be read (the process is gone, or
/// in another pid namespace), a caller with uid 0 counts as privileged and one with no
/// supplementary groups.
fn creds(caller: &Caller) -> Creds {
    let fallback = Creds {
        fsetid: caller.uid == 0,
        groups: Vec::new(),
    };
    if caller.pid == 0 {
        return fallback;
    }
    let dir = std::path::PathBuf::from(format!("/proc/{}", caller.pid));
    let Ok(status) = std::fs::read_to_string(dir.join("status")) else {
        return fallback;
    };
    // Capabilities count only in the user namespace they are held in (capable(2) checks the
    // initial one; a caller in a child namespace holds none over this mount's files).
    let same_ns = std::fs::read_link(dir.join("ns/user")).ok()
        == std::fs::read_link("/proc/self/ns/user").ok();
    let mut c = Creds {
        fsetid: false,
        groups: Vec::new(),
    };
    for line in status.lines() {
        if let Some(hex) = line.strip_prefix("CapEff:") {
            let eff = u64::from_str_radix(hex.trim(), 16).unwrap_or(0);
            c.fsetid = same_ns && eff & (1 << CAP_FSETID) != 0;
        } else if let Some(list) = line.strip_prefix("Groups:") {
            c.groups = list
                .split_whitespace()
                .filter_map(|g| g.parse().ok())
                .collect();
        }
    }
    c
}

/// The set-id bits (`S_ISUID`, `S_ISGID`) a content change by `caller` removes from a regular
/// file of mode `mode` whose group, as the caller sees it, is `file_gid`; 0 for anything else.
/// `creds` is asked only when the file has a set-id bit.
fn bits_to_drop(mode: u32, file_gid: u32, caller: &Caller, creds: impl FnOnce() -> Creds) -> u32 {
    let setid = mode & (libc::S_ISUID | libc::S_ISGID);
    if setid == 0 || mode & libc::S_IFMT != libc::S_IFREG {
        return 0;
    }
    let c = creds();
    if c.fsetid {
        return 0;
    }
    let mut kill = mode & libc::S_ISUID;
    if mode & libc::S_ISGID != 0 {
        let in_group = caller.gid == file_gid || c.groups.contains(&file_gid);
        if mode & libc::S_IXGRP != 0 || !in_group {
            kill |= libc::S_ISGID;
        }
    }
    kill
}

/// Whether `caller` may leave S_ISGID on a file whose group (as the caller sees it) is
/// `file_gid`: it is in that group or holds CAP_FSETID (`in_group_or_capable`).
pub fn may_keep_sgid(caller: &Caller, file_gid: u32) -> bool {
    if caller.gid == file_gid {
        return true;
    }
    let c = creds(caller);
    c.fsetid || c.groups.contains(&file_gid)
}

/// Applies the ACL rule (module docs) to the upper file or directory at `p` (not a symlink:
/// those have no ACLs) after `caller` set its access ACL: `shown_gid` as in
/// [`drop_after_write`]. Returns the new permission bits when it removed S_ISGID.
///
/// Errors: the `stat`/`chmod` errno.
pub fn drop_after_acl(
    p: &std::path::Path,
    caller: &Caller,
    shown_gid: impl FnOnce(u32) -> u32,
) -> std::io::Result<Option<u32>> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let m = std::fs::symlink_metadata(p)?;
    if m.file_type().is_symlink() {
        return Ok(None);
    }
    if m.mode() & libc::S_ISGID == 0 {
        return Ok(None);
    }
    let gid = shown_gid(m.gid());
    let c = creds(caller);
    if c.fsetid || caller.gid == gid || c.groups.contains(&gid) {
        return Ok(None);
    }
    let mode = m.mode() & 0o7777 & !libc::S_ISGID;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))?;
    Ok(Some(mode))
}

/// Applies the kernel's rule to the upper file `f` after a content change by `caller`:
/// `shown_gid` maps the stored group to the one the caller sees (squash). Returns the new
/// permission bits (0o7777) when it removed a bit.
///
/// Errors: the `fstat`/`fchmod` errno.
pub fn drop_after_write(
    f: &File,
    caller: &Caller,
    shown_gid: impl FnOnce(u32) -> u32,
) -> std::io::Result<Option<u32>> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let m = f.metadata()?;
    let kill = bits_to_drop(m.mode(), shown_gid(m.gid()), caller, || creds(caller));
    if kill == 0 {
        return Ok(None);
    }
    let mode = m.mode() & 0o7777 & !kill;
    f.set_permissions(std::fs::Permissions::from_mode(mode))?;
    Ok(Some(mode))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(gid: u32) -> Caller {
        Caller {
            uid: 1000,
            gid,
            pid: 0,
        }
    }

    fn unprivileged(groups: &[u32]) -> impl FnOnce() -> Creds {
        let groups = groups.to_vec();
        move || Creds {
            fsetid: false,
            groups,
        }
    }

    #[test]
    fn the_kernel_rule_of_generic_683() {
        let reg = libc::S_IFREG;
        // Not in the file's group (0): both bits go, with or without group-execute.
        assert_eq!(
            bits_to_drop(reg | 0o6666, 0, &user(1000), unprivileged(&[])),
            0o6000
        );
        assert_eq!(
            bits_to_drop(reg | 0o2676, 0, &user(1000), unprivileged(&[])),
            0o2000
        );
        assert_eq!(
            bits_to_drop(reg | 0o6766, 0, &user(1000), unprivileged(&[])),
            0o6000
        );
        // In the group (primary or supplementary): S_ISGID stays unless group-executable.
        assert_eq!(
            bits_to_drop(reg | 0o6666, 7, &user(7), unprivileged(&[])),
            0o4000
        );
        assert_eq!(
            bits_to_drop(reg | 0o2666, 7, &user(1), unprivileged(&[7])),
            0
        );
        assert_eq!(
            bits_to_drop(reg | 0o2676, 7, &user(7), unprivileged(&[])),
            0o2000
        );
        // CAP_FSETID keeps both; plain files and directories ask nothing.
        let privileged = || Creds {
            fsetid: true,
            groups: Vec::new(),
        };
        assert_eq!(bits_to_drop(reg | 0o6777, 0, &user(1), privileged), 0);
        let never = || -> Creds { panic!("credentials read for a file without set-id bits") };
        assert_eq!(bits_to_drop(reg | 0o0777, 0, &user(1), never), 0);
        let never = || -> Creds { panic!("credentials read for a directory") };
        assert_eq!(bits_to_drop(libc::S_IFDIR | 0o2777, 0, &user(1), never), 0);
    }
}
