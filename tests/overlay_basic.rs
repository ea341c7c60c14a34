//! Overlay semantics: reads, copy-up, deletions, inodes, links, special files, limits and the
//! file-level syscalls package managers rely on (issue 2, "Semantics that must hold").

#[macro_use]
mod common;

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::path::Path;

use common::*;

const MTIME: (i64, i64) = (1_600_000_000, 123_456_789);
const ATIME: (i64, i64) = (1_500_000_000, 987_654_321);
const UID: u32 = 1234;
const GID: u32 = 5678;

fn lower_data() -> Vec<u8> {
    (0..20_000u32).map(|i| (i % 251) as u8).collect()
}

/// A lower file `f` with non-default data, mode, owner, user.* xattrs and ns timestamps.
fn rich_file(l: &Path, name: &str) {
    let p = l.join(name);
    write(&p, lower_data());
    chmod(&p, 0o640);
    chown(&p, UID, GID);
    set_xattr(&p, "user.one", b"1").unwrap();
    set_xattr(&p, "user.two", b"second value").unwrap();
    set_times(&p, ATIME, MTIME);
}

fn rich_lower(l: &Path) {
    rich_file(l, "f");
}

struct Want<'a> {
    data: Option<&'a [u8]>,
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: Option<(i64, i64)>,
    xattrs: &'a [(&'a str, &'a [u8])],
}

impl Want<'_> {
    fn lower() -> Want<'static> {
        Want {
            data: None,
            mode: 0o640,
            uid: UID,
            gid: GID,
            mtime: Some(MTIME),
            xattrs: &[("user.one", b"1"), ("user.two", b"second value")],
        }
    }

    fn check(&self, p: &Path, what: &str) {
        let m = fs::symlink_metadata(p)
            .unwrap_or_else(|e| panic!("{what}: lstat {}: {e}", p.display()));
        if let Some(d) = self.data {
            let got = fs::read(p).unwrap();
            assert!(
                got == d,
                "{what}: data differs ({} bytes, want {})",
                got.len(),
                d.len()
            );
        }
        assert_eq!(m.mode() & 0o7777, self.mode, "{what}: mode");
        assert_eq!((m.uid(), m.gid()), (self.uid, self.gid), "{what}: owner");
        if let Some(t) = self.mtime {
            assert_eq!((m.mtime(), m.mtime_nsec()), t, "{what}: mtime (ns)");
        }
        for (k, v) in self.xattrs {
            assert_eq!(get_xattr(p, k).as_deref(), Some(*v), "{what}: xattr {k}");
        }
    }
}

/// Checks `want` on `f` in the mount, that it was copied up, and again after a remount.
fn check_copied_up(fx: &mut Fixture, name: &str, want: &Want) {
    want.check(&fx.p(name), "after copy-up");
    assert!(
        fx.upper.join(name).exists(),
        "{name} should have been copied up into the upper dir"
    );
    fx.remount();
    want.check(&fx.p(name), "after remount");
}

#[test]
fn reads_lower_files_and_leaves_lower_unmodified() {
    require_root!();
    let fx = Fixture::new(|l| {
        write(&l.join("a.txt"), "alpha\n");
        write(&l.join("dir/sub/b.txt"), "beta\n");
        fs::create_dir(l.join("empty")).unwrap();
        rich_lower(l);
    });
    assert_eq!(read(&fx.p("a.txt")), "alpha\n");
    assert_eq!(read(&fx.p("dir/sub/b.txt")), "beta\n");
    assert_eq!(names(&fx.p("empty")), Vec::<String>::new());
    Want {
        data: Some(&lower_data()),
        ..Want::lower()
    }
    .check(&fx.p("f"), "lower file through the mount");
    // Reading copies nothing up.
    assert_eq!(names(&fx.upper), Vec::<String>::new());
    // Plenty of writes; the Fixture's drop checks the lower fingerprint.
    write(&fx.p("a.txt"), "changed");
    write(&fx.p("dir/sub/new"), "new");
    fs::remove_file(fx.p("dir/sub/b.txt")).unwrap();
    fs::remove_dir(fx.p("empty")).unwrap();
    chmod(&fx.p("f"), 0o600);
}

#[test]
fn copy_up_on_open_for_write() {
    require_root!();
    let mut fx = Fixture::new(|l| {
        rich_file(l, "f");
        rich_file(l, "g");
    });
    // Open for writing without writing: data and mtime preserved. Whether the upper copy is
    // made at open (kernel overlayfs) or lazily at the first write (layercache's no-open mode)
    // is not observable through the mount, so only the merged view is checked here.
    drop(OpenOptions::new().write(true).open(fx.p("g")).unwrap());
    let data = lower_data();
    let want = Want {
        data: Some(&data),
        ..Want::lower()
    };
    want.check(&fx.p("g"), "after open for write");
    fx.remount();
    want.check(&fx.p("g"), "after open for write and remount");
    // Write 5 bytes in the middle: the rest of the data is preserved.
    let f = OpenOptions::new().write(true).open(fx.p("f")).unwrap();
    f.write_at(b"HELLO", 1000).unwrap();
    drop(f);
    let mut want = lower_data();
    want[1000..1005].copy_from_slice(b"HELLO");
    check_copied_up(
        &mut fx,
        "f",
        &Want {
            data: Some(&want),
            mtime: None,
            ..Want::lower()
        },
    );
}

#[test]
fn fds_opened_before_copy_up_see_later_writes() {
    require_root!();
    let fx = Fixture::new(|l| write(&l.join("f"), "lower content\n"));
    // A reader opened while the file is still lower-only, and one that already read it (so
    // its pages are cached), must both see data written through a later writer.
    let early = File::open(fx.p("f")).unwrap();
    let cached = File::open(fx.p("f")).unwrap();
    let mut buf = vec![0u8; 14];
    cached.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(buf, b"lower content\n");
    let w = OpenOptions::new().write(true).open(fx.p("f")).unwrap();
    w.write_at(b"UPPER", 0).unwrap();
    drop(w);
    // In passthrough mode (kernel overlayfs until 4.19 likewise) they keep the lower content.
    let want = if passthrough_mode() {
        "lower content\n"
    } else {
        "UPPER content\n"
    };
    for (name, f) in [("early", &early), ("cached", &cached)] {
        f.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&buf),
            want,
            "{name} reader after the copy-up"
        );
    }
    let m = early.metadata().unwrap();
    assert_eq!(
        m.ino(),
        fs::metadata(fx.p("f")).unwrap().ino(),
        "fstat of the early fd"
    );
}

#[test]
fn attributes_after_a_read_follow_later_changes_and_the_lower_keeps_its_atime() {
    require_root!();
    let fx = Fixture::new(|l| {
        write(&l.join("f"), "lower content\n");
        set_times(&l.join("f"), ATIME, MTIME);
        fs::create_dir(l.join("d")).unwrap();
        write(&l.join("d/x"), "x");
        set_times(&l.join("d"), ATIME, MTIME);
    });
    // A first read, then the fstat a reader does after it (a GETATTR: the kernel invalidates
    // atime after every READ), answered while the file is still lower-only.
    let reader = File::open(fx.p("f")).unwrap();
    let mut buf = Vec::new();
    (&reader).read_to_end(&mut buf).unwrap();
    assert_eq!(buf, b"lower content\n");
    let m = reader.metadata().unwrap();
    assert_eq!((m.len(), m.mode() & 0o7777), (14, 0o644));
    // Reading through the mount writes nothing to the read-only layer, atime included
    // (lower files are opened O_NOATIME, as kernel overlayfs does; relatime would have
    // updated an atime this old).
    let lower = fs::metadata(fx.lower().join("f")).unwrap();
    assert_eq!((lower.atime(), lower.atime_nsec()), ATIME);
    // Changes through the mount show in the next fstat of the same reader.
    chmod(&fx.p("f"), 0o600);
    assert_eq!(
        reader.metadata().unwrap().mode() & 0o7777,
        0o600,
        "after chmod"
    );
    let w = OpenOptions::new().append(true).open(fx.p("f")).unwrap();
    (&w).write_all(b"more\n").unwrap();
    drop(w);
    let m = reader.metadata().unwrap();
    assert_eq!(m.len(), 19, "after an append through another fd");
    buf.clear();
    (&reader).read_to_end(&mut buf).unwrap();
    // In passthrough mode the reader, opened before the copy-up, keeps the lower content.
    let more: &[u8] = if passthrough_mode() { b"" } else { b"more\n" };
    assert_eq!(buf, more);
    // The copy-up read the lower file, a listing reads the lower directory: neither writes
    // their atimes (kernel overlayfs neither).
    let lower = fs::metadata(fx.lower().join("f")).unwrap();
    assert_eq!(
        (lower.atime(), lower.atime_nsec()),
        ATIME,
        "after the copy-up"
    );
    assert_eq!(fs::read_dir(fx.p("d")).unwrap().count(), 1);
    let d = fs::metadata(fx.lower().join("d")).unwrap();
    assert_eq!((d.atime(), d.atime_nsec()), ATIME, "after a listing");
}

#[test]
fn copy_up_on_truncate() {
    require_root!();
    let mut fx = Fixture::new(rich_lower);
    let c = cstr(&fx.p("f"));
    // SAFETY: valid C string.
    assert_eq!(
        unsafe { libc::truncate(c.as_ptr(), 777) },
        0,
        "truncate: errno {}",
        errno()
    );
    let data = lower_data();
    check_copied_up(
        &mut fx,
        "f",
        &Want {
            data: Some(&data[..777]),
            mtime: None,
            ..Want::lower()
        },
    );
}

#[test]
fn copy_up_on_chmod() {
    require_root!();
    let mut fx = Fixture::new(|l| {
        rich_lower(l);
        fs::create_dir(l.join("d")).unwrap();
        write(&l.join("d/child"), "child");
        chmod(&l.join("d"), 0o750);
        chown(&l.join("d"), UID, GID);
        set_xattr(&l.join("d"), "user.one", b"1").unwrap();
        set_xattr(&l.join("d"), "user.two", b"second value").unwrap();
        set_times(&l.join("d"), ATIME, MTIME);
    });
    chmod(&fx.p("f"), 0o604);
    chmod(&fx.p("d"), 0o711);
    let data = lower_data();
    check_copied_up(
        &mut fx,
        "f",
        &Want {
            data: Some(&data),
            mode: 0o604,
            ..Want::lower()
        },
    );
    check_copied_up(
        &mut fx,
        "d",
        &Want {
            mode: 0o711,
            ..Want::lower()
        },
    );
    assert_eq!(read(&fx.p("d/child")), "child");
}

#[test]
fn copy_up_on_chown() {
    require_root!();
    let mut fx = Fixture::new(|l| {
        rich_lower(l);
        std::os::unix::fs::symlink("target/of/link", l.join("sl")).unwrap();
    });
    chown(&fx.p("f"), 4321, 8765);
    chown(&fx.p("sl"), 4321, 8765);
    let data = lower_data();
    check_copied_up(
        &mut fx,
        "f",
        &Want {
            data: Some(&data),
            uid: 4321,
            gid: 8765,
            ..Want::lower()
        },
    );
    let m = fs::symlink_metadata(fx.p("sl")).unwrap();
    assert!(m.file_type().is_symlink());
    assert_eq!((m.uid(), m.gid()), (4321, 8765));
    assert_eq!(
        fs::read_link(fx.p("sl")).unwrap().to_str(),
        Some("target/of/link")
    );
}

#[test]
fn copy_up_on_utimes() {
    require_root!();
    let mut fx = Fixture::new(rich_lower);
    let new_m = (1_700_000_001, 222_333_444);
    set_times(&fx.p("f"), (1_700_000_000, 111_222_333), new_m);
    // atime first: reading the data below updates it (relatime).
    let m = fs::metadata(fx.p("f")).unwrap();
    assert_eq!((m.atime(), m.atime_nsec()), (1_700_000_000, 111_222_333));
    let data = lower_data();
    check_copied_up(
        &mut fx,
        "f",
        &Want {
            data: Some(&data),
            mtime: Some(new_m),
            ..Want::lower()
        },
    );
}

#[test]
fn copy_up_on_setxattr() {
    require_root!();
    let mut fx = Fixture::new(rich_lower);
    set_xattr(&fx.p("f"), "user.three", b"3").unwrap();
    let data = lower_data();
    check_copied_up(
        &mut fx,
        "f",
        &Want {
            data: Some(&data),
            xattrs: &[
                ("user.one", b"1"),
                ("user.two", b"second value"),
                ("user.three", b"3"),
            ],
            ..Want::lower()
        },
    );
    let names: Vec<String> = list_xattrs(&fx.p("f"))
        .into_iter()
        .map(|(k, _)| k.to_string_lossy().into_owned())
        .filter(|k| k.starts_with("user."))
        .collect();
    assert_eq!(names, ["user.one", "user.three", "user.two"]);
}

#[test]
fn copy_up_on_link() {
    require_root!();
    let mut fx = Fixture::new(rich_lower);
    fs::hard_link(fx.p("f"), fx.p("f2")).unwrap();
    let data = lower_data();
    let want = Want {
        data: Some(&data),
        ..Want::lower()
    };
    want.check(&fx.p("f2"), "new link");
    check_copied_up(&mut fx, "f", &want);
    want.check(&fx.p("f2"), "new link after remount");
}

#[test]
fn copy_up_keeps_64mib_sparse_file_sparse() {
    require_root!();
    const SIZE: u64 = 64 << 20;
    let mut fx = Fixture::new(|l| {
        let f = File::create(l.join("sparse")).unwrap();
        f.set_len(SIZE).unwrap();
        f.write_at(b"head", 0).unwrap();
        f.write_at(b"middle", 32 << 20).unwrap();
        f.write_at(b"tail", SIZE - 4).unwrap();
    });
    let f = OpenOptions::new().write(true).open(fx.p("sparse")).unwrap();
    f.write_at(b"new", 48 << 20).unwrap();
    drop(f);
    for round in ["after copy-up", "after remount"] {
        for p in [fx.p("sparse"), fx.upper.join("sparse")] {
            let m = fs::metadata(&p).unwrap();
            assert_eq!(m.len(), SIZE, "{round}: size of {}", p.display());
            // Kernel overlayfs copies data in 1 MiB chunks around holes: about 2 MiB here.
            assert!(
                m.blocks() * 512 <= (4 << 20),
                "{round}: {} is not sparse: {} bytes allocated",
                p.display(),
                m.blocks() * 512
            );
        }
        let f = File::open(fx.p("sparse")).unwrap();
        let mut buf = [0u8; 6];
        for (off, want) in [
            (0u64, &b"head\0\0"[..]),
            (32 << 20, b"middle"),
            (48 << 20, b"new\0\0\0"),
            (SIZE - 6, b"\0\0tail"),
            (16 << 20, b"\0\0\0\0\0\0"),
        ] {
            f.read_exact_at(&mut buf, off).unwrap();
            assert_eq!(&buf[..], want, "{round}: bytes at {off}");
        }
        drop(f);
        if round == "after copy-up" {
            fx.remount();
        }
    }
}

#[test]
fn deletions_persist_across_remount() {
    require_root!();
    let mut fx = Fixture::new(|l| {
        write(&l.join("a"), "a");
        fs::create_dir(l.join("empty")).unwrap();
        write(&l.join("p/x"), "x");
        write(&l.join("p/sub/z"), "z");
        write(&l.join("k/keep"), "keep");
        write(&l.join("k/del"), "del");
    });
    fs::remove_file(fx.p("a")).unwrap();
    fs::remove_dir(fx.p("empty")).unwrap();
    fs::remove_dir_all(fx.p("p")).unwrap();
    fs::remove_file(fx.p("k/del")).unwrap();
    for round in 0..2 {
        for gone in ["a", "empty", "p", "p/x", "p/sub/z", "k/del"] {
            assert_enoent(&fx.p(gone));
        }
        assert_eq!(names(&fx.mnt), ["k"], "round {round}");
        assert_eq!(names(&fx.p("k")), ["keep"], "round {round}");
        for w in ["a", "empty", "p", "k/del"] {
            assert!(
                is_whiteout(&fx.upper.join(w)),
                "upper/{w} should be a whiteout (char device 0/0)"
            );
        }
        fx.remount();
    }
}

#[test]
fn rm_rf_then_mkdir_gives_empty_dir() {
    require_root!();
    let mut fx = Fixture::new(|l| {
        write(&l.join("d/a"), "a");
        write(&l.join("d/b"), "b");
        write(&l.join("d/sub/c"), "c");
    });
    fs::remove_dir_all(fx.p("d")).unwrap();
    fs::create_dir(fx.p("d")).unwrap();
    let check = |fx: &Fixture, want: &[&str]| {
        assert_eq!(names(&fx.p("d")), want);
        for old in ["d/a", "d/b", "d/sub", "d/sub/c"] {
            assert_enoent(&fx.p(old));
        }
        assert!(
            is_opaque(&fx.upper.join("d")),
            "upper/d should carry trusted.overlay.opaque=y"
        );
    };
    check(&fx, &[]);
    fx.remount();
    check(&fx, &[]);
    write(&fx.p("d/new"), "new");
    fx.remount();
    check(&fx, &["new"]);
    // Overlay-private xattrs never show through the merged view.
    let visible: Vec<_> = list_xattrs(&fx.p("d"))
        .into_iter()
        .filter(|(k, _)| k.to_string_lossy().contains("overlay."))
        .collect();
    assert!(visible.is_empty(), "private xattrs visible: {visible:?}");
}

fn drop_caches() {
    // Forces the kernel to forget dentries/inodes, so the overlay must answer lookups again.
    let _ = fs::write("/proc/sys/vm/drop_caches", "2");
}

#[test]
fn st_ino_stable_across_copy_up() {
    require_root!();
    let fx = Fixture::new(|l| {
        write(&l.join("f"), "f");
        write(&l.join("d/g"), "g");
        write(&l.join("d/h"), "h");
    });
    let ino = |p: &str| fs::symlink_metadata(fx.p(p)).unwrap().ino();
    let before: Vec<u64> = ["f", "d", "d/g", "d/h"].iter().map(|p| ino(p)).collect();
    write(&fx.p("f"), "changed");
    write(&fx.p("d/new"), "new");
    chmod(&fx.p("d/g"), 0o600);
    set_xattr(&fx.p("d/h"), "user.x", b"x").unwrap();
    let after: Vec<u64> = ["f", "d", "d/g", "d/h"].iter().map(|p| ino(p)).collect();
    assert_eq!(before, after, "st_ino changed by copy-up (f, d, d/g, d/h)");
    let new_ino = ino("d/new");
    drop_caches();
    let again: Vec<u64> = ["f", "d", "d/g", "d/h"].iter().map(|p| ino(p)).collect();
    assert_eq!(
        before, again,
        "st_ino changed after the kernel forgot the inodes"
    );
    assert_eq!(new_ino, ino("d/new"), "st_ino of an upper file changed");
    // Distinct files have distinct inode numbers.
    let mut all = again.clone();
    all.push(new_ino);
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 5, "inode numbers collide: {again:?} + {new_ino}");
}

/// pjdfstest link::remove_link: three names of one inode, removed one by one while the kernel
/// still holds the inode; each removed name is gone at once and nlink follows.
#[test]
fn removing_hardlinks_one_by_one() {
    require_root!();
    let fx = Fixture::new(|l| write(&l.join("lower"), "l"));
    for base in ["lower", "new"] {
        let file = fx.p(base);
        if base == "new" {
            write(&file, "n");
        }
        let (first, second) = (fx.p(&format!("{base}.1")), fx.p(&format!("{base}.2")));
        fs::hard_link(&file, &first).unwrap();
        fs::hard_link(&first, &second).unwrap();
        let held = File::open(&first).unwrap();
        fs::remove_file(&file).unwrap();
        assert_enoent(&file);
        assert_eq!(fs::symlink_metadata(&first).unwrap().nlink(), 2, "{base}");
        assert_eq!(
            fs::symlink_metadata(&first).unwrap().ino(),
            fs::symlink_metadata(&second).unwrap().ino()
        );
        fs::remove_file(&second).unwrap();
        assert_enoent(&second);
        assert_eq!(fs::symlink_metadata(&first).unwrap().nlink(), 1, "{base}");
        fs::remove_file(&first).unwrap();
        assert_enoent(&first);
        assert_eq!(held.metadata().unwrap().nlink(), 0, "{base}");
    }
}

/// A 0/0 character device is the whiteout encoding: creating one is refused (EPERM), never
/// an EIO or a file that vanishes.
#[test]
fn whiteout_device_cannot_be_created() {
    require_root!();
    let fx = Fixture::new(|_| {});
    let p = std::ffi::CString::new(fx.p("c").as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: valid C string.
    let rc = unsafe { libc::mknod(p.as_ptr(), libc::S_IFCHR | 0o644, 0) };
    let err = std::io::Error::last_os_error();
    assert_eq!(rc, -1);
    assert_eq!(err.raw_os_error(), Some(libc::EPERM), "{err}");
    assert_enoent(&fx.p("c"));
}

#[test]
fn hardlink_to_lower_file() {
    require_root!();
    let mut fx = Fixture::new(|l| write(&l.join("f"), "orig\n"));
    fs::hard_link(fx.p("f"), fx.p("h")).unwrap();
    for round in 0..2 {
        let (a, b) = (
            fs::metadata(fx.p("f")).unwrap(),
            fs::metadata(fx.p("h")).unwrap(),
        );
        assert_eq!(a.ino(), b.ino(), "round {round}: same st_ino");
        assert_eq!((a.nlink(), b.nlink()), (2, 2), "round {round}: nlink");
        OpenOptions::new()
            .append(true)
            .open(fx.p("f"))
            .unwrap()
            .write_all(format!("via f {round}\n").as_bytes())
            .unwrap();
        assert!(read(&fx.p("h")).ends_with(&format!("via f {round}\n")));
        OpenOptions::new()
            .append(true)
            .open(fx.p("h"))
            .unwrap()
            .write_all(format!("via h {round}\n").as_bytes())
            .unwrap();
        assert!(read(&fx.p("f")).ends_with(&format!("via h {round}\n")));
        fx.remount();
    }
    assert_eq!(
        read(&fx.p("f")),
        "orig\nvia f 0\nvia h 0\nvia f 1\nvia h 1\n"
    );
    fs::remove_file(fx.p("f")).unwrap();
    assert_eq!(fs::metadata(fx.p("h")).unwrap().nlink(), 1);
    assert_enoent(&fx.p("f"));
}

#[test]
fn symlinks_including_dangling() {
    require_root!();
    let mut fx = Fixture::new(|l| {
        write(&l.join("f"), "data");
        write(&l.join("dir/inner"), "inner");
        std::os::unix::fs::symlink("f", l.join("sl")).unwrap();
        std::os::unix::fs::symlink("dir", l.join("dl")).unwrap();
        std::os::unix::fs::symlink("nowhere", l.join("dangling")).unwrap();
    });
    assert_eq!(read(&fx.p("sl")), "data");
    assert_eq!(read(&fx.p("dl/inner")), "inner");
    assert!(
        fs::symlink_metadata(fx.p("dangling"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(
        fs::metadata(fx.p("dangling")).unwrap_err().raw_os_error(),
        Some(libc::ENOENT)
    );
    assert_eq!(
        fs::read_link(fx.p("dangling")).unwrap().to_str(),
        Some("nowhere")
    );
    std::os::unix::fs::symlink("missing/target", fx.p("newdangling")).unwrap();
    std::os::unix::fs::symlink("dir/inner", fx.p("newsl")).unwrap();
    // Writing through a dangling symlink creates its target.
    write(&fx.p("dangling"), "created");
    for _ in 0..2 {
        assert_eq!(read(&fx.p("nowhere")), "created");
        assert_eq!(
            fs::read_link(fx.p("newdangling")).unwrap().to_str(),
            Some("missing/target")
        );
        assert_eq!(read(&fx.p("newsl")), "inner");
        let m = fs::symlink_metadata(fx.p("newdangling")).unwrap();
        assert_eq!(m.len(), "missing/target".len() as u64, "symlink st_size");
        fx.remount();
    }
    fs::remove_file(fx.p("sl")).unwrap();
    assert_enoent(&fx.p("sl"));
    assert_eq!(read(&fx.p("f")), "data");
}

#[test]
fn fifo_and_unix_socket() {
    require_root!();
    let mut fx = Fixture::new(|l| {
        let c = cstr(&l.join("lowerfifo"));
        // SAFETY: valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    });
    let c = cstr(&fx.p("fifo"));
    // SAFETY: valid C string.
    assert_eq!(
        unsafe { libc::mkfifo(c.as_ptr(), 0o644) },
        0,
        "mkfifo: errno {}",
        errno()
    );
    for name in ["fifo", "lowerfifo"] {
        let p = fx.p(name);
        assert!(fs::symlink_metadata(&p).unwrap().file_type().is_fifo());
        let writer = std::thread::spawn({
            let p = p.clone();
            move || {
                let mut w = OpenOptions::new().write(true).open(p).unwrap();
                w.write_all(b"through the pipe").unwrap();
            }
        });
        let mut got = String::new();
        File::open(&p).unwrap().read_to_string(&mut got).unwrap();
        writer.join().unwrap();
        assert_eq!(got, "through the pipe", "{name}");
    }
    let sock = fx.p("sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let client = std::thread::spawn({
        let sock = sock.clone();
        move || {
            let mut s = std::os::unix::net::UnixStream::connect(sock).unwrap();
            s.write_all(b"ping").unwrap();
        }
    });
    let (mut conn, _) = listener.accept().unwrap();
    let mut got = String::new();
    conn.read_to_string(&mut got).unwrap();
    client.join().unwrap();
    assert_eq!(got, "ping");
    // Both the listener and the accepted socket pin the mount.
    drop(conn);
    drop(listener);
    fx.remount();
    assert!(
        fs::symlink_metadata(fx.p("sock"))
            .unwrap()
            .file_type()
            .is_socket()
    );
    assert!(
        fs::symlink_metadata(fx.p("fifo"))
            .unwrap()
            .file_type()
            .is_fifo()
    );
}

#[test]
fn names_of_255_bytes() {
    require_root!();
    let long = |c: char| c.to_string().repeat(255);
    let mut fx = Fixture::new(|l| {
        write(&l.join(long('a')), "lower");
        write(&l.join(long('d')), "to delete");
    });
    assert_eq!(read(&fx.p(&long('a'))), "lower");
    write(&fx.p(&long('b')), "upper");
    let err = fs::write(fx.p(&"c".repeat(256)), "x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENAMETOOLONG));
    fs::rename(fx.p(&long('a')), fx.p(&long('e'))).unwrap();
    fs::remove_file(fx.p(&long('d'))).unwrap();
    fs::create_dir(fx.p(&long('f'))).unwrap();
    write(&fx.p(&format!("{}/{}", long('f'), long('g'))), "deep");
    for _ in 0..2 {
        let want: Vec<String> = ['b', 'e', 'f'].iter().map(|c| long(*c)).collect();
        assert_eq!(names(&fx.mnt), want);
        assert_eq!(read(&fx.p(&long('e'))), "lower");
        assert_eq!(read(&fx.p(&long('b'))), "upper");
        assert_eq!(read(&fx.p(&format!("{}/{}", long('f'), long('g')))), "deep");
        fx.remount();
    }
}

#[test]
fn tree_120_levels_deep() {
    require_root!();
    let deep = |root: &str| {
        let mut p = String::from(root);
        for i in 0..120 {
            p += &format!("/lvl{i:03}");
        }
        p
    };
    let mut fx = Fixture::new(|l| write(&l.join(deep("low")).join("leaf"), "bottom"));
    let low_leaf = format!("{}/leaf", deep("low"));
    assert_eq!(read(&fx.p(&low_leaf)), "bottom");
    write(&fx.p(&low_leaf), "rewritten");
    assert!(fx.upper.join(&low_leaf).exists(), "120 parents copied up");
    let new_leaf = format!("{}/leaf", deep("new"));
    write(&fx.p(&new_leaf), "new bottom");
    fx.remount();
    assert_eq!(read(&fx.p(&low_leaf)), "rewritten");
    assert_eq!(read(&fx.p(&new_leaf)), "new bottom");
    let walked = walk_count(&fx.mnt);
    assert_eq!(walked, 2 * 121 + 2, "entries found by a recursive walk");
    fs::remove_dir_all(fx.p("new")).unwrap();
    fs::remove_dir_all(fx.p("low")).unwrap();
    assert_eq!(names(&fx.mnt), Vec::<String>::new());
}

fn walk_count(p: &Path) -> usize {
    let mut n = 0;
    for e in fs::read_dir(p).unwrap() {
        let e = e.unwrap();
        n += 1;
        if e.file_type().unwrap().is_dir() {
            n += walk_count(&e.path());
        }
    }
    n
}

#[test]
fn statfs_reports_the_upper_filesystem() {
    require_root!();
    let fx = Fixture::new(|l| write(&l.join("f"), "f"));
    let vfs = |p: &Path| {
        let c = cstr(p);
        // SAFETY: zeroed statvfs is a valid out-parameter.
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: valid C string and out-pointer.
        assert_eq!(
            unsafe { libc::statvfs(c.as_ptr(), &mut s) },
            0,
            "statvfs {}",
            p.display()
        );
        s
    };
    let (m, u) = (vfs(&fx.mnt), vfs(&fx.upper));
    assert!(m.f_bsize > 0 && m.f_frsize > 0, "block sizes");
    assert!(m.f_namemax >= 255, "f_namemax {}", m.f_namemax);
    let total = |s: &libc::statvfs| s.f_blocks as u128 * s.f_frsize as u128;
    let avail = |s: &libc::statvfs| s.f_bavail as u128 * s.f_frsize as u128;
    assert!(total(&m) > 0, "f_blocks");
    let diff = total(&m).abs_diff(total(&u));
    assert!(
        diff * 100 <= total(&u),
        "total size {} vs upper {}",
        total(&m),
        total(&u)
    );
    let diff = avail(&m).abs_diff(avail(&u));
    assert!(
        diff * 100 <= total(&u),
        "available {} vs upper {}",
        avail(&m),
        avail(&u)
    );
}

fn open_flags(p: &Path, flags: i32) -> Result<File, i32> {
    use std::os::fd::FromRawFd;
    let c = cstr(p);
    // SAFETY: valid C string; the returned fd is owned by the File.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, 0o644) };
    if fd < 0 {
        Err(errno())
    } else {
        // SAFETY: fd is a fresh descriptor we own.
        Ok(unsafe { File::from_raw_fd(fd) })
    }
}

#[test]
fn o_excl_create() {
    require_root!();
    let fx = Fixture::new(|l| {
        write(&l.join("f"), "f");
        write(&l.join("del"), "del");
        fs::create_dir(l.join("d")).unwrap();
        std::os::unix::fs::symlink("nowhere", l.join("dangling")).unwrap();
    });
    let excl = libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY;
    for existing in ["f", "d", "dangling"] {
        assert_eq!(
            open_flags(&fx.p(existing), excl).err(),
            Some(libc::EEXIST),
            "{existing}"
        );
    }
    fs::remove_file(fx.p("del")).unwrap();
    open_flags(&fx.p("del"), excl).expect("O_EXCL over a deleted lower name");
    assert_eq!(open_flags(&fx.p("del"), excl).err(), Some(libc::EEXIST));
    open_flags(&fx.p("new"), excl).expect("O_EXCL new name");
    assert_eq!(open_flags(&fx.p("new"), excl).err(), Some(libc::EEXIST));
    assert_enoent(&fx.p("nowhere"));
    assert_eq!(fs::read(fx.p("del")).unwrap(), b"");
}

#[test]
fn fallocate_allocates_and_punches() {
    require_root!();
    let fx = Fixture::new(|l| write(&l.join("f"), "0123456789"));
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(fx.p("f"))
        .unwrap();
    // SAFETY: valid fd.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, 1 << 20) };
    assert_eq!(r, 0, "fallocate: errno {}", errno());
    let m = f.metadata().unwrap();
    assert_eq!(m.len(), 1 << 20);
    assert!(
        m.blocks() * 512 >= 1 << 20,
        "allocated {}",
        m.blocks() * 512
    );
    let mut buf = [0u8; 10];
    f.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"0123456789", "data kept by copy-up + fallocate");
    let g = File::create(fx.p("g")).unwrap();
    // SAFETY: valid fd.
    let r = unsafe { libc::fallocate(g.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, 0, 1 << 20) };
    assert_eq!(r, 0, "fallocate KEEP_SIZE: errno {}", errno());
    let m = g.metadata().unwrap();
    assert_eq!(m.len(), 0);
    assert!(m.blocks() * 512 >= 1 << 20);
    f.write_at(&[b'x'; 8192], 0).unwrap();
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // SAFETY: valid fd.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), punch, 0, 4096) };
    assert_eq!(r, 0, "punch hole: errno {}", errno());
    let mut buf = vec![0u8; 8192];
    f.read_exact_at(&mut buf, 0).unwrap();
    assert!(buf[..4096].iter().all(|b| *b == 0) && buf[4096..].iter().all(|b| *b == b'x'));
}

#[test]
fn copy_file_range_between_files() {
    require_root!();
    let data: Vec<u8> = (0..(3u32 << 20)).map(|i| (i * 7 % 253) as u8).collect();
    let fx = Fixture::new(|l| write(&l.join("src"), &data));
    let copy = |src: &File, dst: &File, len: usize| {
        let mut done = 0;
        while done < len {
            // SAFETY: valid fds; null offsets use and advance the file positions.
            let n = unsafe {
                libc::copy_file_range(
                    src.as_raw_fd(),
                    std::ptr::null_mut(),
                    dst.as_raw_fd(),
                    std::ptr::null_mut(),
                    len - done,
                    0,
                )
            };
            assert!(n > 0, "copy_file_range returned {n}, errno {}", errno());
            done += n as usize;
        }
    };
    let src = File::open(fx.p("src")).unwrap();
    let dst = File::create(fx.p("dst")).unwrap();
    copy(&src, &dst, data.len());
    drop(dst);
    assert!(
        fs::read(fx.p("dst")).unwrap() == data,
        "lower -> upper copy"
    );
    // Upper -> lower-backed file (copy-up of the destination), at an offset.
    let mut dst2 = OpenOptions::new().write(true).open(fx.p("src")).unwrap();
    dst2.seek(SeekFrom::Start(1000)).unwrap();
    let mut small = File::create(fx.p("small")).unwrap();
    small.write_all(b"INSERTED").unwrap();
    drop(small);
    let small = File::open(fx.p("small")).unwrap();
    copy(&small, &dst2, 8);
    drop(dst2);
    let mut want = data.clone();
    want[1000..1008].copy_from_slice(b"INSERTED");
    assert!(
        fs::read(fx.p("src")).unwrap() == want,
        "upper -> copied-up copy"
    );
}

#[test]
fn unlink_of_open_file_keeps_fd_usable() {
    require_root!();
    let fx = Fixture::new(|l| {
        write(&l.join("rw"), "lower rw");
        write(&l.join("ro"), "lower ro");
    });
    let mut rw = OpenOptions::new()
        .read(true)
        .write(true)
        .open(fx.p("rw"))
        .unwrap();
    let mut ro = File::open(fx.p("ro")).unwrap();
    write(&fx.p("up"), "upper");
    let mut up = OpenOptions::new()
        .read(true)
        .write(true)
        .open(fx.p("up"))
        .unwrap();
    for n in ["rw", "ro", "up"] {
        fs::remove_file(fx.p(n)).unwrap();
        assert_enoent(&fx.p(n));
    }
    assert_eq!(rw.metadata().unwrap().nlink(), 0);
    let mut s = String::new();
    ro.read_to_string(&mut s).unwrap();
    assert_eq!(s, "lower ro");
    for (f, before) in [(&mut rw, "lower rw"), (&mut up, "upper")] {
        f.seek(SeekFrom::End(0)).unwrap();
        f.write_all(b" + more").unwrap();
        f.seek(SeekFrom::Start(0)).unwrap();
        let mut s = String::new();
        f.read_to_string(&mut s).unwrap();
        assert_eq!(s, format!("{before} + more"));
        f.sync_all().unwrap();
    }
    // The names are free again and independent of the open files.
    write(&fx.p("rw"), "fresh");
    assert_eq!(read(&fx.p("rw")), "fresh");
    assert_eq!(names(&fx.mnt), ["rw"]);
    if Impl::current() != Impl::Layercache {
        return;
    }
    // Once closed, the kept data of the unlinked files leaves the workdir while the mount is
    // in use (removed by a later request, not by the FORGET, which may come after umount).
    drop((rw, ro, up));
    let orphans = fx.work.join("orphans");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        // A request (FUSE answers every statfs(2) from the daemon).
        let c = cstr(&fx.mnt);
        // SAFETY: a NUL-ended path and a statvfs buffer of the right type.
        let r = unsafe { libc::statvfs(c.as_ptr(), &mut std::mem::zeroed()) };
        assert_eq!(r, 0, "statvfs: errno {}", errno());
        let left = names(&orphans);
        if left.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "unlinked files' data still in the workdir 20 s after the close: {left:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn removed_directory_held_open_keeps_answering_fstat_and_fchmod() {
    require_root!();
    let fx = Fixture::new(|l| {
        fs::create_dir(l.join("low")).unwrap();
        write(&l.join("low/f"), "lower child");
    });
    fs::create_dir(fx.p("up")).unwrap();
    write(&fx.p("up/g"), "upper child");
    for d in ["low", "up"] {
        // As a shell whose cwd is removed (`cd d; rm -rf ../d; ls .`) or a tool holding an fd.
        let dir = File::open(fx.p(d)).unwrap();
        fs::remove_dir_all(fx.p(d)).unwrap();
        assert_enoent(&fx.p(d));
        let md = dir
            .metadata()
            .unwrap_or_else(|e| panic!("fstat of removed {d}: {e}"));
        assert!(md.is_dir(), "{d}");
        // 0 as on a disk filesystem (kernel overlayfs keeps 1 for a removed merged directory).
        assert!(md.nlink() <= 1, "nlink of removed {d}: {}", md.nlink());
        dir.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .unwrap_or_else(|e| panic!("fchmod of removed {d}: {e}"));
        assert_eq!(dir.metadata().unwrap().mode() & 0o7777, 0o700, "{d}");
        // `ls -l .` reads its xattrs (security.selinux, POSIX ACLs): none, not an error.
        let mut buf = [0u8; 256];
        // SAFETY: a valid fd, a NUL-terminated name and a buffer of the given length.
        let got = unsafe {
            libc::fgetxattr(
                dir.as_raw_fd(),
                c"user.any".as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        assert_eq!(
            (got, errno()),
            (-1, libc::ENODATA),
            "getxattr of removed {d}"
        );
        // SAFETY: a valid fd and a buffer of the given length.
        let listed =
            unsafe { libc::flistxattr(dir.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        assert_eq!(listed, 0, "listxattr of removed {d}: errno {}", errno());
        // "." still opens; listing it gives nothing (the kernel answers getdents of a dead
        // directory itself, with ENOENT, which ls and readdir(3) users treat as the end).
        // SAFETY: a valid dirfd and a NUL-terminated name; the fd is owned just below.
        let fd = unsafe {
            libc::openat(
                dir.as_raw_fd(),
                c".".as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY,
            )
        };
        assert!(fd >= 0, "open . in removed {d}: errno {}", errno());
        // SAFETY: fd was just opened here and is used nowhere else.
        let owned = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        let mut listing = rustix::fs::Dir::new(owned).unwrap();
        let names: Vec<_> = std::iter::from_fn(|| listing.read())
            .filter_map(|e| e.ok())
            .collect();
        assert!(
            names.is_empty(),
            "removed {d} lists {} entries",
            names.len()
        );
    }
    assert_eq!(names(&fx.mnt), Vec::<String>::new());
}

#[test]
fn o_tmpfile_works_or_eopnotsupp() {
    require_root!();
    let fx = Fixture::new(|l| fs::create_dir(l.join("d")).unwrap());
    for dir in [fx.mnt.clone(), fx.p("d")] {
        match open_flags(&dir, libc::O_TMPFILE | libc::O_RDWR) {
            Err(e) => assert_eq!(
                e,
                libc::EOPNOTSUPP,
                "O_TMPFILE in {}: want success or EOPNOTSUPP, got errno {e}",
                dir.display()
            ),
            Ok(mut f) => {
                f.write_all(b"anonymous").unwrap();
                f.seek(SeekFrom::Start(0)).unwrap();
                let mut s = String::new();
                f.read_to_string(&mut s).unwrap();
                assert_eq!(s, "anonymous");
                let proc_path = cstr(Path::new(&format!("/proc/self/fd/{}", f.as_raw_fd())));
                let target = cstr(&dir.join("linked"));
                // SAFETY: valid C strings.
                let r = unsafe {
                    libc::linkat(
                        libc::AT_FDCWD,
                        proc_path.as_ptr(),
                        libc::AT_FDCWD,
                        target.as_ptr(),
                        libc::AT_SYMLINK_FOLLOW,
                    )
                };
                assert_eq!(r, 0, "linkat of an O_TMPFILE: errno {}", errno());
                assert_eq!(read(&dir.join("linked")), "anonymous");
            }
        }
    }
}

#[test]
fn mmap_shared_writes() {
    require_root!();
    let mut fx = Fixture::new(|l| write(&l.join("f"), vec![b'a'; 8192]));
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(fx.p("f"))
        .unwrap();
    // SAFETY: mapping 8192 bytes of a file of that size, shared, read-write.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            8192,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED, "mmap: errno {}", errno());
    // SAFETY: map is 8192 bytes long, writable.
    unsafe {
        let s = std::slice::from_raw_parts_mut(map.cast::<u8>(), 8192);
        assert!(
            s.iter().all(|b| *b == b'a'),
            "lower data visible through the mapping"
        );
        s[..4].copy_from_slice(b"MMAP");
        s[4096..4100].copy_from_slice(b"PAGE");
        assert_eq!(libc::msync(map, 8192, libc::MS_SYNC), 0);
        assert_eq!(libc::munmap(map, 8192), 0);
    }
    drop(f);
    let check = |fx: &Fixture| {
        let got = fs::read(fx.p("f")).unwrap();
        assert_eq!(&got[..4], b"MMAP");
        assert_eq!(&got[4096..4100], b"PAGE");
        assert_eq!(got.len(), 8192);
    };
    check(&fx);
    fx.remount();
    check(&fx);
}

/// Runs `child` in a forked process and returns its exit status. `child` must only make
/// async-signal-safe calls (the test process has other threads).
fn in_child(child: impl FnOnce() -> i32) -> i32 {
    // SAFETY: the child only runs `child` (raw syscalls) and _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        let code = child();
        // SAFETY: _exit is async-signal-safe and skips atexit handlers.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: pid is our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "child did not exit normally");
    libc::WEXITSTATUS(status)
}

#[test]
fn flock_between_processes() {
    require_root!();
    let fx = Fixture::new(|l| write(&l.join("f"), "lock me"));
    // The parent locks through a read-only fd of the lower file; the child opens it for
    // writing (copy-up) and must still see the lock.
    let f = File::open(fx.p("f")).unwrap();
    let path = cstr(&fx.p("f"));
    let try_lock = |op: i32| {
        let path = path.clone();
        in_child(move || {
            // SAFETY: valid C string; raw syscalls only.
            let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR) };
            if fd < 0 {
                return 2;
            }
            // SAFETY: valid fd.
            match unsafe { libc::flock(fd, op | libc::LOCK_NB) } {
                0 => 0,
                _ => 1,
            }
        })
    };
    let f = if passthrough_mode() {
        // The documented rule of passthrough mode: an fd opened before a copy-up is the lower
        // file's, for locks too (kernel overlayfs until 4.19: "any open files referring to
        // this inode will access the old data"). The child's open copies the file up.
        // SAFETY: valid fd.
        assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) }, 0);
        assert_eq!(try_lock(libc::LOCK_EX), 0, "the copy is another file");
        // SAFETY: valid fd.
        assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_UN) }, 0);
        File::open(fx.p("f")).unwrap()
    } else {
        f
    };
    // SAFETY: valid fd.
    assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) }, 0);
    assert_eq!(
        try_lock(libc::LOCK_EX),
        1,
        "exclusive flock must block another process"
    );
    assert_eq!(
        try_lock(libc::LOCK_SH),
        1,
        "shared flock must block against exclusive"
    );
    // SAFETY: valid fd.
    assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH) }, 0);
    assert_eq!(try_lock(libc::LOCK_SH), 0, "two shared flocks coexist");
    assert_eq!(try_lock(libc::LOCK_EX), 1, "exclusive blocked by shared");
    // SAFETY: valid fd.
    assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_UN) }, 0);
    assert_eq!(try_lock(libc::LOCK_EX), 0, "free after unlock");
}

#[test]
fn fcntl_locks_between_processes() {
    require_root!();
    let fx = Fixture::new(|l| write(&l.join("f"), vec![b'x'; 1000]));
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(fx.p("f"))
        .unwrap();
    let setlk = |fd: i32, ty: i32, start: i64, len: i64| {
        // SAFETY: zeroed flock is a valid value.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = ty as i16;
        fl.l_whence = libc::SEEK_SET as i16;
        fl.l_start = start;
        fl.l_len = len;
        // SAFETY: valid fd and flock.
        unsafe { libc::fcntl(fd, libc::F_SETLK, &fl) }
    };
    assert_eq!(setlk(f.as_raw_fd(), libc::F_WRLCK, 0, 100), 0, "F_SETLK");
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    let path = cstr(&fx.p("f"));
    let probe = |start: i64, len: i64| {
        let path = path.clone();
        in_child(move || {
            // SAFETY: raw syscalls only.
            let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR) };
            if fd < 0 {
                return 2;
            }
            // SAFETY: zeroed flock is valid.
            let mut fl: libc::flock = unsafe { std::mem::zeroed() };
            fl.l_type = libc::F_WRLCK as i16;
            fl.l_whence = libc::SEEK_SET as i16;
            fl.l_start = start;
            fl.l_len = len;
            // SAFETY: valid fd and flock.
            if unsafe { libc::fcntl(fd, libc::F_GETLK, &mut fl) } != 0 {
                return 2;
            }
            let conflict = fl.l_type != libc::F_UNLCK as i16;
            if conflict && (fl.l_pid != parent || fl.l_type != libc::F_WRLCK as i16) {
                return 3;
            }
            fl.l_type = libc::F_WRLCK as i16;
            fl.l_start = start;
            fl.l_len = len;
            // SAFETY: valid fd and flock.
            let r = unsafe { libc::fcntl(fd, libc::F_SETLK, &fl) };
            match (r == 0, conflict) {
                (true, false) => 0,
                (false, true) => 1,
                _ => 4,
            }
        })
    };
    assert_eq!(
        probe(50, 10),
        1,
        "overlapping range must be locked (F_GETLK names the parent)"
    );
    assert_eq!(probe(200, 10), 0, "disjoint range is free");
    assert_eq!(setlk(f.as_raw_fd(), libc::F_UNLCK, 0, 100), 0);
    assert_eq!(probe(50, 10), 0, "free after F_UNLCK");
}

#[test]
fn upper_dir_is_readable_by_kernel_overlayfs() {
    require_root!();
    skip_for!(
        Impl::Kernel,
        "compares another implementation's upper dir with the kernel's view"
    );
    let mut fx = Fixture::new(|l| {
        write(&l.join("del"), "del");
        write(&l.join("edit"), "old");
        write(&l.join("opaque/old"), "old");
        write(&l.join("moved/a"), "a");
        write(&l.join("moved/sub/b"), "b");
        write(&l.join("keep/x"), "x");
        write(&l.join("keep/gone"), "gone");
    });
    fs::remove_file(fx.p("del")).unwrap();
    write(&fx.p("edit"), "new");
    fs::remove_dir_all(fx.p("opaque")).unwrap();
    fs::create_dir(fx.p("opaque")).unwrap();
    write(&fx.p("opaque/fresh"), "fresh");
    fs::rename(fx.p("moved"), fx.p("renamed")).unwrap();
    fs::remove_file(fx.p("keep/gone")).unwrap();
    set_xattr(&fx.p("edit"), "user.k", b"v").unwrap();
    let check = |fx: &Fixture, what: &str| {
        assert_eq!(
            names(&fx.mnt),
            ["edit", "keep", "opaque", "renamed"],
            "{what}"
        );
        assert_eq!(read(&fx.p("edit")), "new", "{what}");
        assert_eq!(
            get_xattr(&fx.p("edit"), "user.k").as_deref(),
            Some(&b"v"[..]),
            "{what}"
        );
        assert_eq!(names(&fx.p("opaque")), ["fresh"], "{what}");
        assert_eq!(names(&fx.p("renamed")), ["a", "sub"], "{what}");
        assert_eq!(read(&fx.p("renamed/sub/b")), "b", "{what}");
        assert_eq!(names(&fx.p("keep")), ["x"], "{what}");
    };
    check(&fx, "implementation under test");
    fx.with_kernel_view(|fx| check(fx, "kernel overlayfs over the same upper"));
    check(&fx, "implementation under test, remounted");
}

/// Lower files that are hardlinks of each other show one st_ino and the lower's nlink, as on
/// kernel overlayfs (without `index=on`, its default); copying one name up breaks it from the
/// group: it shows its own inode and nlink 1, the names left in the lower keep the group's
/// inode and (stale) nlink, and none of them sees the write. Checked on the implementation
/// under test, after the kernel forgot the inodes, and on kernel overlayfs over the same dirs.
#[test]
fn lower_hardlinks_show_one_inode_until_copied_up() {
    require_root!();
    skip_for!(
        Impl::FuseOverlayfs,
        "fuse-overlayfs counts a lower inode's names it has looked up as nlink (2 of 3 here)"
    );
    let mut fx = Fixture::new(|l| {
        write(&l.join("x"), "dup");
        fs::hard_link(l.join("x"), l.join("y")).unwrap();
        fs::create_dir(l.join("sub")).unwrap();
        fs::hard_link(l.join("x"), l.join("sub/w")).unwrap();
        write(&l.join("z"), "dup");
    });
    let md = |fx: &Fixture, p: &str| fs::symlink_metadata(fx.p(p)).unwrap();
    let before = |fx: &Fixture, what: &str| {
        let (x, y, w, z) = (md(fx, "x"), md(fx, "y"), md(fx, "sub/w"), md(fx, "z"));
        assert_eq!((x.ino(), x.ino()), (y.ino(), w.ino()), "{what}: one st_ino");
        assert_eq!(
            (x.nlink(), y.nlink(), w.nlink()),
            (3, 3, 3),
            "{what}: nlink"
        );
        assert_eq!(z.nlink(), 1, "{what}");
        assert_ne!(z.ino(), x.ino(), "{what}: a file of its own");
        // readdir's d_ino is the st_ino.
        let entry = fs::read_dir(fx.p("sub")).unwrap().next().unwrap().unwrap();
        let d_ino = std::os::unix::fs::DirEntryExt::ino(&entry);
        assert_eq!(d_ino, w.ino(), "{what}: d_ino");
        x.ino()
    };
    let ino = before(&fx, "implementation under test");
    drop_caches();
    assert_eq!(before(&fx, "after forget"), ino, "stable after forget");
    fx.with_kernel_view(|fx| {
        before(fx, "kernel overlayfs");
    });
    OpenOptions::new()
        .append(true)
        .open(fx.p("x"))
        .unwrap()
        .write_all(b"+x")
        .unwrap();
    let after = |fx: &Fixture, what: &str| {
        let (x, y, w) = (md(fx, "x"), md(fx, "y"), md(fx, "sub/w"));
        assert_eq!(read(&fx.p("x")), "dup+x", "{what}");
        assert_eq!(
            (read(&fx.p("y")), read(&fx.p("sub/w"))),
            ("dup".into(), "dup".into())
        );
        assert_eq!(
            x.nlink(),
            1,
            "{what}: the copied-up name broke from the group"
        );
        assert_ne!(x.ino(), y.ino(), "{what}");
        assert_eq!(y.ino(), w.ino(), "{what}: the lower names stay one inode");
        assert_eq!((y.nlink(), w.nlink()), (3, 3), "{what}: the lower's nlink");
        x.ino()
    };
    let copied = after(&fx, "implementation under test, after copy-up");
    drop_caches();
    assert_eq!(after(&fx, "after copy-up and forget"), copied, "stable");
    fx.with_kernel_view(|fx| {
        after(fx, "kernel overlayfs over the same upper");
    });
}

/// linkat(fd, "", AT_FDCWD, to, AT_EMPTY_PATH): names the file open at `fd`.
fn link_fd(fd: &File, to: &Path) -> Result<(), i32> {
    let c = cstr(to);
    // SAFETY: an open fd, an empty and a NUL-ended path.
    let r = unsafe {
        libc::linkat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_EMPTY_PATH,
        )
    };
    if r == 0 { Ok(()) } else { Err(errno()) }
}

/// open(dir, O_TMPFILE | extra, mode) (xfstests generic/004, 389, 531; DESIGN.md: "O_TMPFILE
/// works or returns EOPNOTSUPP").
fn open_tmpfile(dir: &Path, extra: i32, mode: u32) -> Result<File, i32> {
    let c = cstr(dir);
    // SAFETY: a NUL-ended path; the fd returned is owned by the File.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_TMPFILE | libc::O_RDWR | extra, mode) };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: a new fd we own.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// O_TMPFILE in a lower directory: an unnamed file (nlink 0, no entry in the directory) that
/// reads back what was written, takes the mode asked less the umask, is named by linkat
/// (AT_EMPTY_PATH) with its data, and survives a remount under that name; an `O_EXCL` one
/// cannot be named (ENOENT), and an unnamed one leaves nothing in the upper dir.
#[test]
fn o_tmpfile_makes_an_unnamed_file_that_linkat_can_name() {
    require_root!();
    let mut fx = Fixture::new(|l| write(&l.join("d/lower"), "lower"));
    // SAFETY: umask has no preconditions; restored below (tests share the process umask).
    let old = unsafe { libc::umask(0o022) };
    let t = open_tmpfile(&fx.p("d"), 0, 0o666);
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    let mut t = t.unwrap_or_else(|e| panic!("open(O_TMPFILE): errno {e}"));
    t.write_all(b"tmp data").unwrap();
    let m = t.metadata().unwrap();
    assert_eq!(m.nlink(), 0, "unnamed");
    assert_eq!(m.mode() & 0o7777, 0o644, "mode less the umask");
    assert_eq!(names(&fx.p("d")), ["lower"], "no entry before linkat");
    t.seek(SeekFrom::Start(0)).unwrap();
    let mut s = String::new();
    t.read_to_string(&mut s).unwrap();
    assert_eq!(s, "tmp data");
    link_fd(&t, &fx.p("d/named")).unwrap_or_else(|e| panic!("linkat: errno {e}"));
    assert_eq!(read(&fx.p("d/named")), "tmp data");
    assert_eq!(fs::metadata(fx.p("d/named")).unwrap().nlink(), 1);
    assert_eq!(t.metadata().unwrap().nlink(), 1, "the fd sees its name");
    assert_eq!(
        fs::metadata(fx.p("d/named")).unwrap().ino(),
        t.metadata().unwrap().ino()
    );
    t.write_all(b", more").unwrap();
    drop(t);
    assert_eq!(read(&fx.p("d/named")), "tmp data, more");
    let x = open_tmpfile(&fx.p("d"), libc::O_EXCL, 0o600).unwrap();
    assert_eq!(link_fd(&x, &fx.p("d/excl")), Err(libc::ENOENT), "O_EXCL");
    drop(x);
    let mut u = open_tmpfile(&fx.p("d"), 0, 0o600).unwrap();
    u.write_all(b"never named").unwrap();
    drop(u);
    fx.remount();
    assert_eq!(read(&fx.p("d/named")), "tmp data, more");
    let mut in_upper = names(&fx.upper.join("d"));
    in_upper.sort();
    assert_eq!(
        in_upper,
        ["named"],
        "only the named file reached the upper dir"
    );
}

/// O_TMPFILE in a directory with a default ACL (xfstests generic/389): the unnamed file gets
/// that ACL and the mode it implies, not the umask, as a file made by creat(2) there does —
/// in a lower directory (copied up first) and in an upper one.
#[test]
fn o_tmpfile_in_a_directory_with_a_default_acl_takes_the_acl_not_the_umask() {
    require_root!();
    let fx = Fixture::new(|l| write(&l.join("lowdir/f"), "lower"));
    fs::create_dir(fx.p("updir")).unwrap();
    for dir in ["lowdir", "updir"] {
        sh(&fx.mnt, &format!("setfacl -d -m u::rw,g::rw,o::r {dir}"));
        // SAFETY: umask has no preconditions; restored below (tests share the process umask).
        let old = unsafe { libc::umask(0o022) };
        let t = open_tmpfile(&fx.p(dir), 0, 0o666);
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        let t = t.unwrap_or_else(|e| panic!("{dir}: open(O_TMPFILE): errno {e}"));
        assert_eq!(
            t.metadata().unwrap().mode() & 0o7777,
            0o664,
            "{dir}: the default ACL's mode, not 0666 less the umask"
        );
        link_fd(&t, &fx.p(&format!("{dir}/named"))).unwrap();
        let acl = sh(&fx.mnt, &format!("getfacl -c {dir}/named"));
        assert!(acl.contains("group::rw-"), "{dir}/named ACL: {acl}");
        let m = fs::metadata(fx.p(&format!("{dir}/named"))).unwrap();
        assert_eq!(m.uid(), 0, "{dir}/named owner");
        // Without a default ACL the umask applies (the plain O_TMPFILE test).
    }
}
