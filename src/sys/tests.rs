use std::os::fd::AsRawFd;

use super::*;

#[test]
fn users_and_groups_are_looked_up() {
    // Every passwd and group database has root, uid 0 / gid 0.
    assert_eq!(user_by_name("root").unwrap(), Some((0, 0)));
    assert_eq!(user_by_uid(0).unwrap(), Some((0, 0)));
    assert_eq!(group_by_name("root").unwrap(), Some(0));
    assert_eq!(user_by_name("no-such-user-layercache").unwrap(), None);
    assert_eq!(group_by_name("no-such-group-layercache").unwrap(), None);
    assert_eq!(user_by_name("ro\0ot").unwrap(), None);
}

#[test]
fn at_wrappers_report_their_errno() {
    let t = tempfile::tempdir().unwrap();
    let d = std::fs::File::open(t.path()).unwrap();
    let fd = d.as_raw_fd();
    mkdirat(fd, c"sub", 0o755).unwrap();
    let e = mkdirat(fd, c"sub", 0o755).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EEXIST));
    symlinkat(c"sub", fd, c"lnk").unwrap();
    assert_eq!(readlinkat(fd, c"lnk").unwrap(), b"sub");
    let st = fstatat(fd, c"lnk", libc::AT_SYMLINK_NOFOLLOW).unwrap();
    assert_eq!(st.st_mode & libc::S_IFMT, libc::S_IFLNK);
    let e = openat(fd, c"lnk", libc::O_RDONLY | libc::O_NOFOLLOW, 0).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ELOOP));
    renameat2(fd, c"lnk", fd, c"sub", libc::RENAME_NOREPLACE)
        .map(drop)
        .unwrap_err();
    unlinkat(fd, c"sub", libc::AT_REMOVEDIR).unwrap();
    let e = fstatat(fd, c"sub", 0).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
    // A missing layer's fd (-1) is only EBADF.
    let e = fstatat(-1, c"x", 0).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EBADF));
}

#[test]
fn poll_one_sees_a_closed_reader_and_unshare_refuses_clone_files() {
    let (r, w) = std::io::pipe().unwrap();
    use std::os::fd::AsFd;
    assert_eq!(
        poll_one(w.as_fd(), libc::POLLOUT, 0).unwrap() & libc::POLLERR,
        0
    );
    drop(r);
    assert_ne!(
        poll_one(w.as_fd(), libc::POLLOUT, 0).unwrap() & libc::POLLERR,
        0
    );
    let e = unshare(libc::CLONE_FILES).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
}

#[test]
fn an_empty_buffer_asks_the_xattr_and_list_sizes() {
    let t = tempfile::tempdir().unwrap();
    let f = t.path().join("f");
    std::fs::write(&f, "x").unwrap();
    if set_xattr(&f, b"user.fish", b"fishval").is_err() {
        return; // no user xattrs on this filesystem
    }
    let p = cpath(&f).unwrap();
    let file = std::fs::File::open(&f).unwrap();
    use std::os::fd::AsFd;
    for x in [Xattrs::Path(&p), Xattrs::Fd(file.as_fd())] {
        assert_eq!(x.get_into(c"user.fish", &mut []).unwrap(), 7, "{x:?}");
        let n = x.list_into(&mut []).unwrap();
        let mut buf = vec![0u8; 4096];
        assert_eq!(n, x.list_into(&mut buf).unwrap(), "{x:?}");
        assert!(n >= b"user.fish\0".len(), "{x:?}");
    }
}

/// Byte locks of one open file description conflict with another description's on the same
/// byte only, never wait, and go with the description.
#[test]
fn ofd_byte_locks_conflict_per_open_file_description() {
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join("locks");
    let open = || {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&p)
            .unwrap()
    };
    let (a, b) = (open(), open());
    let far = 1u64 << 61;
    assert!(ofd_lock_byte(&a, far, true).unwrap());
    assert!(ofd_lock_byte(&a, far, true).unwrap(), "its own lock again");
    assert!(!ofd_lock_byte(&b, far, true).unwrap(), "held by the other");
    assert!(
        ofd_lock_byte(&b, far + 1, true).unwrap(),
        "the next byte is free"
    );
    assert!(ofd_lock_byte(&a, far, false).unwrap());
    assert!(ofd_lock_byte(&b, far, true).unwrap(), "released");
    drop(b);
    assert!(
        ofd_lock_byte(&a, far + 1, true).unwrap(),
        "closed: released"
    );
    assert!(ofd_lock_byte(&a, u64::MAX, true).is_err());
}
