//! FUSE passthrough mode (`LAYERCACHE_PASSTHROUGH=1`, issues 15 and 23): sequences of opens,
//! writes and copy-ups that must never fail with EIO (the kernel's one-I/O-mode-per-inode rule
//! makes a wrong OPEN answer an EIO), and copy-up by re-lookup: a change to a lower file held
//! open through passthrough copies it up under a new node id, the kernel's retry of the open
//! (ESTALE → LOOKUP_REVAL) finds the copy, and metadata calls (path- or fd-based) apply to the
//! copy. The one documented rule it changes: fds opened before the copy-up keep reading the
//! lower content (kernel overlayfs until 4.19, fuse-overlayfs 2.0).

#[macro_use]
mod common;

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};

use common::*;

fn fixture() -> Fixture {
    let mut fx = Fixture::builder().unmounted().build(|l| {
        write(&l[0].join("f"), "lower content\n");
        write(&l[0].join("g"), "g lower\n");
        for n in ["h", "i", "j", "k", "m"] {
            write(&l[0].join(n), format!("{n} lower\n"));
        }
        set_xattr(&l[0].join("k"), "user.old", b"1").unwrap();
    });
    fx.mount_with(|c| {
        c.env("LAYERCACHE_PASSTHROUGH", "1");
    });
    fx
}

fn contents(f: &File) -> String {
    let mut buf = vec![0u8; 64];
    let n = f.read_at(&mut buf, 0).unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn opens_writes_and_copy_ups_in_sequence_never_fail() {
    require_root!();
    only_layercache!("LAYERCACHE_PASSTHROUGH is layercache's");
    let fx = fixture();
    // Read a lower file, close it, then write it (copy-up at open) and read it again while
    // the writer is open: every open of the copy shares its backing file.
    assert_eq!(read(&fx.p("f")), "lower content\n");
    let w = OpenOptions::new().write(true).open(fx.p("f")).unwrap();
    w.write_at(b"UPPER", 0).unwrap();
    let r = File::open(fx.p("f")).unwrap();
    assert_eq!(contents(&r), "UPPER content\n");
    w.set_len(5).unwrap();
    assert_eq!(contents(&r), "UPPER");
    drop((w, r));
    assert_eq!(read(&fx.upper.join("f")), "UPPER");
    // A created file: written and read back through two opens at once.
    let mut c = File::create(fx.p("new")).unwrap();
    c.write_all(b"created").unwrap();
    let r = File::open(fx.p("new")).unwrap();
    assert_eq!(contents(&r), "created");
    drop((c, r));
    // A metadata copy-up (chmod) while a reader is open: new readers still work.
    let early = File::open(fx.p("g")).unwrap();
    chmod(&fx.p("g"), 0o600);
    let late = File::open(fx.p("g")).unwrap();
    assert_eq!(contents(&early), "g lower\n");
    assert_eq!(contents(&late), "g lower\n");
    drop((early, late));
    // Once the readers are gone the copy can be written.
    fs::write(fx.p("g"), "g upper\n").unwrap();
    let mut s = String::new();
    File::open(fx.p("g"))
        .unwrap()
        .read_to_string(&mut s)
        .unwrap();
    assert_eq!(s, "g upper\n");
}

/// Panics unless the libc call's result `r` is 0 (naming `what` and the errno).
#[track_caller]
fn ok(r: i32, what: &str) {
    assert_eq!(r, 0, "{what}: {}", std::io::Error::last_os_error());
}

#[test]
fn a_writer_while_lower_readers_are_open_gets_the_copy_and_old_fds_keep_the_lower_content() {
    require_root!();
    only_layercache!("LAYERCACHE_PASSTHROUGH is layercache's");
    let fx = fixture();
    let reader = File::open(fx.p("f")).unwrap();
    assert_eq!(contents(&reader), "lower content\n");
    let ino = reader.metadata().unwrap().ino();
    // The kernel sends OPEN(lower node, write) -> ESTALE, LOOKUPs the name again, finds the
    // copy's node id and opens that: the caller sees one successful open.
    let w = OpenOptions::new().write(true).open(fx.p("f")).unwrap();
    w.write_at(b"UPPER", 0).unwrap();
    let late = File::open(fx.p("f")).unwrap();
    assert_eq!(
        contents(&late),
        "UPPER content\n",
        "a new open reads the copy"
    );
    // The documented rule of passthrough mode: an fd opened before the copy-up keeps reading
    // the lower file's content.
    assert_eq!(contents(&reader), "lower content\n", "the early fd");
    for (what, m) in [
        ("path", fs::metadata(fx.p("f")).unwrap()),
        ("early fd", reader.metadata().unwrap()),
        ("writer", w.metadata().unwrap()),
    ] {
        assert_eq!(m.ino(), ino, "st_ino of the {what} after the copy-up");
    }
    // O_TRUNC while a reader is open: the retried open truncates the copy.
    let g = File::open(fx.p("g")).unwrap();
    let mut t = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(fx.p("g"))
        .unwrap();
    t.write_all(b"new g").unwrap();
    drop(t);
    assert_eq!(read(&fx.p("g")), "new g");
    assert_eq!(contents(&g), "g lower\n");
    drop((reader, w, late, g));
    assert_eq!(read(&fx.upper.join("f")), "UPPER content\n");
    assert_eq!(read(&fx.upper.join("g")), "new g");
    fx.assert_lower_unchanged();
}

#[test]
fn path_based_metadata_changes_while_readers_are_open_apply_to_the_copy() {
    require_root!();
    only_layercache!("LAYERCACHE_PASSTHROUGH is layercache's");
    let fx = fixture();
    let held: Vec<File> = ["f", "g", "h", "i", "k"]
        .iter()
        .map(|n| File::open(fx.p(n)).unwrap())
        .collect();
    chmod(&fx.p("f"), 0o600);
    // truncate(2): SETATTR(size) on the lower node.
    ok(
        unsafe { libc::truncate(cstr(&fx.p("g")).as_ptr(), 3) },
        "truncate",
    );
    chown(&fx.p("h"), 1234, 5678);
    set_times(&fx.p("i"), (1_000_000, 5), (2_000_000, 7));
    set_xattr(&fx.p("k"), "user.new", b"2").unwrap();
    let k = cstr(&fx.p("k"));
    ok(
        unsafe { libc::removexattr(k.as_ptr(), c"user.old".as_ptr()) },
        "removexattr",
    );
    let m = |n: &str| fs::metadata(fx.p(n)).unwrap();
    assert_eq!(m("f").permissions().mode() & 0o7777, 0o600);
    assert_eq!(m("g").len(), 3);
    assert_eq!(read(&fx.p("g")), "g l");
    assert_eq!((m("h").uid(), m("h").gid()), (1234, 5678));
    assert_eq!((m("i").mtime(), m("i").mtime_nsec()), (2_000_000, 7));
    assert_eq!(
        get_xattr(&fx.p("k"), "user.new").as_deref(),
        Some(&b"2"[..])
    );
    assert_eq!(get_xattr(&fx.p("k"), "user.old"), None);
    // The held fds: their fstat shows the copy's metadata, their reads the lower content.
    assert_eq!(
        held[0].metadata().unwrap().permissions().mode() & 0o7777,
        0o600
    );
    assert_eq!(held[2].metadata().unwrap().uid(), 1234);
    assert_eq!(contents(&held[1]), "g lower\n");
    // A writer of a file whose name still leads to the superseded node in the kernel's
    // cache: its OPEN gets ESTALE and the retry opens the copy.
    fs::write(fx.p("f"), "f upper\n").unwrap();
    assert_eq!(read(&fx.p("f")), "f upper\n");
    assert_eq!(read(&fx.upper.join("f")), "f upper\n");
    assert_eq!(
        fs::metadata(fx.upper.join("f"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777,
        0o600
    );
    drop(held);
    fx.assert_lower_unchanged();
}

#[test]
fn fd_based_metadata_calls_on_a_read_only_fd_apply_to_the_copy() {
    require_root!();
    only_layercache!("LAYERCACHE_PASSTHROUGH is layercache's");
    let fx = fixture();
    // FUSE sends fchmod/fchown/futimens as a SETATTR without a file handle and fsetxattr as
    // SETXATTR: the same requests as the path-based calls, but the kernel does not retry them
    // on ESTALE. They must succeed and change the file.
    let f = File::open(fx.p("f")).unwrap();
    let fd = f.as_raw_fd();
    ok(unsafe { libc::fchmod(fd, 0o640) }, "fchmod");
    ok(unsafe { libc::fchown(fd, 42, 43) }, "fchown");
    let ts = [
        libc::timespec {
            tv_sec: 1_500_000,
            tv_nsec: 0,
        },
        libc::timespec {
            tv_sec: 1_600_000,
            tv_nsec: 9,
        },
    ];
    ok(unsafe { libc::futimens(fd, ts.as_ptr()) }, "futimens");
    ok(
        unsafe { libc::fsetxattr(fd, c"user.fd".as_ptr(), b"v".as_ptr().cast(), 1, 0) },
        "fsetxattr",
    );
    let viewed = fs::metadata(fx.p("f")).unwrap();
    let fstat = f.metadata().unwrap();
    for (what, m) in [("path", &viewed), ("fd", &fstat)] {
        assert_eq!(m.permissions().mode() & 0o7777, 0o640, "{what}");
        assert_eq!((m.uid(), m.gid()), (42, 43), "{what}");
        assert_eq!((m.mtime(), m.mtime_nsec()), (1_600_000, 9), "{what}");
    }
    assert_eq!(get_xattr(&fx.p("f"), "user.fd").as_deref(), Some(&b"v"[..]));
    let up = fs::metadata(fx.upper.join("f")).unwrap();
    assert_eq!(
        up.permissions().mode() & 0o7777,
        0o640,
        "the copy in the upper dir"
    );
    assert_eq!(contents(&f), "lower content\n");
    // Changes through the path after the copy-up show through the early fd's fstat too.
    chmod(&fx.p("f"), 0o604);
    assert_eq!(f.metadata().unwrap().permissions().mode() & 0o7777, 0o604);
    // And the file can be written while the early fd is still open.
    fs::write(fx.p("f"), "written\n").unwrap();
    assert_eq!(read(&fx.p("f")), "written\n");
    assert_eq!(contents(&f), "lower content\n");
    drop(f);
    fx.assert_lower_unchanged();
}

#[test]
fn renames_and_links_of_files_held_open_keep_one_copy() {
    require_root!();
    only_layercache!("LAYERCACHE_PASSTHROUGH is layercache's");
    let fx = fixture();
    let f = File::open(fx.p("f")).unwrap();
    let g = File::open(fx.p("g")).unwrap();
    fs::create_dir(fx.p("d")).unwrap();
    fs::rename(fx.p("f"), fx.p("d/f2")).unwrap();
    fs::write(fx.p("d/f2"), "moved and written\n").unwrap();
    assert_eq!(read(&fx.p("d/f2")), "moved and written\n");
    assert_eq!(read(&fx.upper.join("d/f2")), "moved and written\n");
    assert!(!fx.p("f").exists());
    fs::hard_link(fx.p("g"), fx.p("g2")).unwrap();
    OpenOptions::new()
        .append(true)
        .open(fx.p("g2"))
        .unwrap()
        .write_all(b"more\n")
        .unwrap();
    assert_eq!(
        read(&fx.p("g")),
        "g lower\nmore\n",
        "one inode behind both names"
    );
    assert_eq!(
        fs::metadata(fx.p("g")).unwrap().ino(),
        fs::metadata(fx.p("g2")).unwrap().ino()
    );
    assert_eq!(fs::metadata(fx.p("g")).unwrap().nlink(), 2);
    // Unlinked while the early fd is open: its fstat still works.
    fs::remove_file(fx.p("d/f2")).unwrap();
    assert!(f.metadata().is_ok());
    assert_eq!(contents(&f), "lower content\n");
    assert_eq!(contents(&g), "g lower\n");
    drop((f, g));
    fx.assert_lower_unchanged();
}

#[test]
fn interleaved_readers_and_writers_of_one_file_never_fail() {
    require_root!();
    only_layercache!("LAYERCACHE_PASSTHROUGH is layercache's");
    let fx = fixture();
    // Many readers and writers of one file, interleaved: no open fails (EIO or ESTALE).
    let mut keep = Vec::new();
    for round in 0..4 {
        keep.push(File::open(fx.p("m")).unwrap());
        let mut w = OpenOptions::new()
            .append(true)
            .custom_flags(libc::O_NOATIME)
            .open(fx.p("m"))
            .unwrap();
        writeln!(w, "round {round}").unwrap();
    }
    assert_eq!(
        read(&fx.p("m")),
        "m lower\nround 0\nround 1\nround 2\nround 3\n"
    );
    assert_eq!(contents(&keep[0]), "m lower\n", "opened before the copy-up");
    for (i, k) in keep.iter().enumerate().skip(1) {
        // Opened on the copy: every writer since shares its backing file.
        let all = "m lower\nround 0\nround 1\nround 2\nround 3\n";
        assert_eq!(contents(k), all, "reader {i}");
    }
}
