//! File handles on an overlay mount (issue 25, xfstests generic/426, 467, 477, 756, 777): a
//! handle from name_to_handle_at(2) opens the same file with open_by_handle_at(2) after the
//! kernel has forgotten the inode (`echo 2 > /proc/sys/vm/drop_caches`), across a copy-up, a
//! rename and a clean remount, and gives ESTALE once the file is unlinked — as kernel overlayfs
//! does with `nfs_export=on` (Documentation/filesystems/overlayfs.rst, "NFS export"). FUSE's side is
//! fs/fuse/inode.c `fuse_export_operations`: a handle is the node id and generation, and an
//! inode the kernel forgot is found again with LOOKUP(node id, ".") (and a directory's parent
//! with LOOKUP(node id, "..")).
//!
//! `LAYERCACHE_TEST_IMPL=kernel` runs these on kernel overlayfs with `index=on,nfs_export=on`.

#[macro_use]
mod common;

use std::ffi::CString;
use std::fs;
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

use common::*;

/// Bytes of handle data asked for (MAX_HANDLE_SZ).
const MAX_HANDLE: usize = 128;

/// A `struct file_handle` with room for [`MAX_HANDLE`] bytes.
#[repr(C)]
struct Handle {
    bytes: u32,
    kind: i32,
    data: [u8; MAX_HANDLE],
}

/// The fixture with the kernel options nfs export needs on kernel overlayfs.
fn fixture(populate: impl FnOnce(&Path)) -> Fixture {
    Fixture::builder()
        .kernel_opt("index=on")
        .kernel_opt("nfs_export=on")
        .build(|l| populate(&l[0]))
}

/// name_to_handle_at(2) of `p` (not following a last symlink).
fn handle_of(p: &Path) -> Handle {
    let c = cstr(p);
    let mut h = Handle {
        bytes: MAX_HANDLE as u32,
        kind: 0,
        data: [0; MAX_HANDLE],
    };
    let mut mnt_id: libc::c_int = 0;
    // SAFETY: `h` is a file_handle with `bytes` of room after its header; the path is NUL-ended.
    let r = unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            libc::AT_FDCWD,
            c.as_ptr(),
            &mut h as *mut Handle,
            &mut mnt_id as *mut libc::c_int,
            0,
        )
    };
    assert_eq!(r, 0, "name_to_handle_at {}: errno {}", p.display(), errno());
    h
}

/// open_by_handle_at(2) of `h` on the filesystem mounted at `mnt` (needs CAP_DAC_READ_SEARCH).
fn open_handle(mnt: &Path, h: &Handle, flags: i32) -> Result<OwnedFd, i32> {
    let m = fs::File::open(mnt).unwrap();
    // SAFETY: `h` is a valid file_handle; the mount fd is open for the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_by_handle_at,
            std::os::fd::AsRawFd::as_raw_fd(&m),
            h as *const Handle,
            flags,
        )
    };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: a new fd the kernel just returned, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Makes the kernel forget every unused inode and dentry (the FUSE module sends FORGET).
fn drop_caches() {
    fs::write("/proc/sys/vm/drop_caches", "2").expect("drop caches");
}

fn read_fd(fd: OwnedFd) -> String {
    let mut s = String::new();
    fs::File::from(fd).read_to_string(&mut s).unwrap();
    s
}

fn ino_of_fd(fd: &OwnedFd) -> (u64, u32) {
    let f = fs::File::from(fd.try_clone().unwrap());
    let m = f.metadata().unwrap();
    (m.ino(), m.mode() & libc::S_IFMT)
}

/// A lower file, a file made in the mount (upper), a hard-linked upper file and a lower
/// directory: each handle opens the right file after the kernel forgot them all, and the hard
/// link still opens after its first name is unlinked.
#[test]
fn handles_open_lower_upper_linked_files_and_dirs_after_the_kernel_forgot_them() {
    require_root!();
    let fx = fixture(|l| {
        write(&l.join("dir/lower.txt"), "lower data");
    });
    write(&fx.p("dir/upper.txt"), "upper data");
    write(&fx.p("dir/linked"), "linked data");
    fs::hard_link(fx.p("dir/linked"), fx.p("dir/second")).unwrap();
    let cases = [
        ("dir/lower.txt", "lower data"),
        ("dir/upper.txt", "upper data"),
        ("dir/linked", "linked data"),
        ("dir/second", "linked data"),
    ];
    let handles: Vec<Handle> = cases.iter().map(|(p, _)| handle_of(&fx.p(p))).collect();
    let dir_handle = handle_of(&fx.p("dir"));
    let dir_ino = fs::metadata(fx.p("dir")).unwrap().ino();
    drop_caches();
    for ((p, want), h) in cases.iter().zip(&handles) {
        let fd = open_handle(&fx.mnt, h, libc::O_RDONLY)
            .unwrap_or_else(|e| panic!("open_by_handle_at {p}: errno {e}"));
        assert_eq!(read_fd(fd), *want, "{p} by handle");
    }
    let d = open_handle(&fx.mnt, &dir_handle, libc::O_RDONLY | libc::O_DIRECTORY)
        .unwrap_or_else(|e| panic!("open_by_handle_at dir: errno {e}"));
    assert_eq!(ino_of_fd(&d), (dir_ino, libc::S_IFDIR), "dir by handle");
    drop(d);
    // The first name goes; the handle opens the inode through the second.
    fs::remove_file(fx.p("dir/linked")).unwrap();
    drop_caches();
    let fd = open_handle(&fx.mnt, &handles[2], libc::O_RDONLY)
        .unwrap_or_else(|e| panic!("open_by_handle_at of a link whose first name went: {e}"));
    assert_eq!(read_fd(fd), "linked data");
}

/// A lower file's handle, taken before its copy-up, opens the copy (new content) afterwards,
/// and still does after a rename into another directory.
#[test]
fn a_handle_outlives_copy_up_and_rename() {
    require_root!();
    let fx = fixture(|l| {
        write(&l.join("a/f"), "old");
        fs::create_dir(l.join("b")).unwrap();
    });
    let h = handle_of(&fx.p("a/f"));
    let ino = fs::metadata(fx.p("a/f")).unwrap().ino();
    drop_caches();
    fs::write(fx.p("a/f"), "new content").unwrap();
    assert!(
        fx.upper.join("a/f").exists(),
        "the write copied the file up"
    );
    drop_caches();
    let fd = open_handle(&fx.mnt, &h, libc::O_RDONLY)
        .unwrap_or_else(|e| panic!("open_by_handle_at after copy-up: errno {e}"));
    assert_eq!(
        ino_of_fd(&fd).0,
        ino,
        "same inode number as before the copy-up"
    );
    assert_eq!(read_fd(fd), "new content");
    fs::rename(fx.p("a/f"), fx.p("b/g")).unwrap();
    drop_caches();
    let fd = open_handle(&fx.mnt, &h, libc::O_RDONLY)
        .unwrap_or_else(|e| panic!("open_by_handle_at after rename: errno {e}"));
    assert_eq!(read_fd(fd), "new content");
}

/// Unlinked files (lower and upper) and a removed directory give ESTALE once the kernel
/// forgot them, while a file left in place beside them, and one kept open through the unlink,
/// still open by handle.
#[test]
fn handles_of_unlinked_files_are_stale() {
    require_root!();
    let fx = fixture(|l| {
        write(&l.join("lower.txt"), "l");
        write(&l.join("gone/x"), "x");
    });
    write(&fx.p("upper.txt"), "u");
    write(&fx.p("kept"), "kept data");
    write(&fx.p("stays"), "still here");
    let hs = handle_of(&fx.p("stays"));
    let hl = handle_of(&fx.p("lower.txt"));
    let hu = handle_of(&fx.p("upper.txt"));
    let hk = handle_of(&fx.p("kept"));
    let hd = handle_of(&fx.p("gone"));
    let open = fs::File::open(fx.p("kept")).unwrap();
    fs::remove_file(fx.p("lower.txt")).unwrap();
    fs::remove_file(fx.p("upper.txt")).unwrap();
    fs::remove_file(fx.p("kept")).unwrap();
    fs::remove_file(fx.p("gone/x")).unwrap();
    fs::remove_dir(fx.p("gone")).unwrap();
    // A new file under the old name is another file: the old handle must not open it.
    write(&fx.p("upper.txt"), "another file");
    drop_caches();
    for (what, h) in [("lower", &hl), ("upper", &hu), ("directory", &hd)] {
        let r = open_handle(&fx.mnt, h, libc::O_RDONLY).map(read_fd);
        assert_eq!(r, Err(libc::ESTALE), "{what} handle after unlink");
    }
    let fd = open_handle(&fx.mnt, &hk, libc::O_RDONLY)
        .unwrap_or_else(|e| panic!("handle of an unlinked file still open: errno {e}"));
    assert_eq!(read_fd(fd), "kept data");
    drop(open);
    let fd = open_handle(&fx.mnt, &hs, libc::O_RDONLY)
        .unwrap_or_else(|e| panic!("handle of a file left in place: errno {e}"));
    assert_eq!(read_fd(fd), "still here");
}

/// A file opened by handle while its directory is still held by the kernel (so the daemon finds
/// that directory live, not parked) stays reachable after the kernel forgets the directory and
/// its parent: the kernel holds the file through a dentry with no parent, so the daemon must
/// hold the directory chain for it. Before the fix the daemon answered ENOENT to the file's
/// OPEN/READ once the grandparent was forgotten (the flake of generic/467 and of
/// `a_handle_outlives_copy_up_and_rename` under load, where a delayed FORGET made the daemon
/// see a node as live in the same way), and ESTALE to a handle of another file there.
#[test]
fn a_file_opened_by_handle_keeps_its_directories_after_the_kernel_forgets_them() {
    require_root!();
    let fx = fixture(|l| {
        write(&l.join("a/x/lower"), "lower data");
    });
    write(&fx.p("a/x/upper"), "upper data");
    write(&fx.p("a/x/later"), "opened later");
    let hl = handle_of(&fx.p("a/x/later"));
    let cases = [("lower", "lower data"), ("upper", "upper data")];
    let handles: Vec<Handle> = cases
        .iter()
        .map(|(n, _)| handle_of(&fx.p(&format!("a/x/{n}"))))
        .collect();
    // The directory stays in the kernel's cache while the files are forgotten.
    let dir = fs::File::open(fx.p("a/x")).unwrap();
    drop_caches();
    // Opened by handle: the files' inodes now live on dentries with no parent. Not read yet.
    let held: Vec<OwnedFd> = handles
        .iter()
        .map(|h| open_handle(&fx.mnt, h, libc::O_RDONLY).unwrap())
        .collect();
    // Now the kernel forgets "a/x" and "a" (nothing of its own holds them any more).
    drop(dir);
    drop_caches();
    // A file first opened now: its directory is live in the daemon (the held files pin it),
    // its grandparent forgotten (ESTALE before the fix: its name could not be resolved).
    let fd = open_handle(&fx.mnt, &hl, libc::O_RDONLY)
        .unwrap_or_else(|e| panic!("open_by_handle_at of a file in a held directory: errno {e}"));
    assert_eq!(read_fd(fd), "opened later");
    for (((name, want), h), fd) in cases.iter().zip(&handles).zip(held) {
        let again = open_handle(&fx.mnt, h, libc::O_RDONLY)
            .unwrap_or_else(|e| panic!("open_by_handle_at {name} again: errno {e}"));
        assert_eq!(read_fd(again), *want, "{name} by a second handle open");
        assert_eq!(read_fd(fd), *want, "{name} through the fd opened first");
    }
    assert_eq!(fs::read_to_string(fx.p("a/x/lower")).unwrap(), "lower data");
}

/// A directory opened by handle after the kernel forgot it and its parents is connected:
/// `..` from it is its parent, and names in it resolve (LOOKUP "..": the kernel walks up).
#[test]
fn a_directory_handle_walks_up_to_its_parent() {
    require_root!();
    let fx = fixture(|l| {
        write(&l.join("top/mid/leaf/file"), "deep");
    });
    write(&fx.p("top/mid/leaf/new"), "made");
    let h = handle_of(&fx.p("top/mid/leaf"));
    let mid = fs::metadata(fx.p("top/mid")).unwrap().ino();
    let top = fs::metadata(fx.p("top")).unwrap().ino();
    drop_caches();
    let d = open_handle(&fx.mnt, &h, libc::O_RDONLY | libc::O_DIRECTORY)
        .unwrap_or_else(|e| panic!("open_by_handle_at of a directory: errno {e}"));
    let at = |fd: &OwnedFd, name: &str| -> OwnedFd {
        let c = CString::new(name).unwrap();
        // SAFETY: a valid dir fd and a NUL-ended name.
        let r = unsafe {
            libc::openat(
                std::os::fd::AsRawFd::as_raw_fd(fd),
                c.as_ptr(),
                libc::O_RDONLY,
            )
        };
        assert!(r >= 0, "openat {name}: errno {}", errno());
        // SAFETY: a new fd we own.
        unsafe { OwnedFd::from_raw_fd(r) }
    };
    let up = at(&d, "..");
    assert_eq!(
        ino_of_fd(&up),
        (mid, libc::S_IFDIR),
        ".. of the handle's dir"
    );
    let upup = at(&up, "..");
    assert_eq!(ino_of_fd(&upup), (top, libc::S_IFDIR), "../..");
    assert_eq!(read_fd(at(&d, "file")), "deep");
    assert_eq!(read_fd(at(&d, "new")), "made");
    // The kernel names the reconnected directory by its real path.
    let link = fs::read_link(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&d)
    ))
    .unwrap();
    assert_eq!(link, fx.p("top/mid/leaf"));
}

/// A handle from an earlier mount opens its own file (the node index carries the ids over a
/// clean remount, as kernel overlayfs's index does) or, where a new mount starts its counter
/// ids again, is ESTALE by the generation; it never opens the new file that may have its id. A
/// handle of this mount opens.
#[test]
fn a_handle_of_an_earlier_mount_never_opens_another_file() {
    require_root!();
    let mut fx = fixture(|_| {});
    write(&fx.p("first"), "first mount");
    let old = handle_of(&fx.p("first"));
    fx.remount();
    // The first upper file this mount sees gets the id "first" had in the last one.
    write(&fx.p("second"), "another file");
    let new = handle_of(&fx.p("second"));
    drop_caches();
    match open_handle(&fx.mnt, &old, libc::O_RDONLY).map(read_fd) {
        Err(e) => assert_eq!(e, libc::ESTALE, "old handle"),
        Ok(s) => assert_eq!(s, "first mount", "old handle opened another file"),
    }
    let fd = open_handle(&fx.mnt, &new, libc::O_RDONLY)
        .unwrap_or_else(|e| panic!("handle of this mount: errno {e}"));
    assert_eq!(read_fd(fd), "another file");
}

/// Opens `h` on `mnt` and reads it; the errno when it does not open.
fn read_handle(mnt: &Path, h: &Handle) -> Result<String, i32> {
    open_handle(mnt, h, libc::O_RDONLY).map(read_fd)
}

/// Handles survive a clean remount of the same upperdir and workdir (xfstests generic/477,
/// 777): a file made in the mount, a lower file, a lower file copied up before the handle was
/// taken and one copied up after, and a directory made in the mount, which opens connected.
#[test]
fn handles_survive_a_remount() {
    require_root!();
    let mut fx = fixture(|l| {
        write(&l.join("d/lower.txt"), "lower data");
        write(&l.join("d/early.txt"), "early old");
        write(&l.join("d/late.txt"), "late old");
    });
    write(&fx.p("d/upper.txt"), "upper data");
    write(&fx.p("d/early.txt"), "early new");
    write(&fx.p("new/dir/f"), "in a new dir");
    let cases = [
        ("d/upper.txt", "upper data"),
        ("d/lower.txt", "lower data"),
        ("d/early.txt", "early new"),
        ("d/late.txt", "late new"),
        ("new/dir/f", "in a new dir"),
    ];
    let handles: Vec<Handle> = cases.iter().map(|(p, _)| handle_of(&fx.p(p))).collect();
    let inos: Vec<u64> = cases
        .iter()
        .map(|(p, _)| fs::metadata(fx.p(p)).unwrap().ino())
        .collect();
    let dir = handle_of(&fx.p("new/dir"));
    // Copied up after its handle was taken.
    fs::write(fx.p("d/late.txt"), "late new").unwrap();
    fx.remount();
    for (((p, want), h), ino) in cases.iter().zip(&handles).zip(&inos) {
        let fd = open_handle(&fx.mnt, h, libc::O_RDONLY)
            .unwrap_or_else(|e| panic!("open_by_handle_at {p} after remount: errno {e}"));
        assert_eq!(ino_of_fd(&fd).0, *ino, "{p}: the inode number it had");
        assert_eq!(read_fd(fd), *want, "{p} by handle after remount");
    }
    let d = open_handle(&fx.mnt, &dir, libc::O_RDONLY | libc::O_DIRECTORY)
        .unwrap_or_else(|e| panic!("open_by_handle_at of a directory after remount: errno {e}"));
    let link = fs::read_link(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&d)
    ))
    .unwrap();
    assert_eq!(link, fx.p("new/dir"), "connected to its path");
    drop(d);
    // Names looked up normally give the same inodes (one node per file).
    assert_eq!(fs::metadata(fx.p("d/upper.txt")).unwrap().ino(), inos[0]);
    // And again through a second remount, made at once after the umount (xfstests'
    // _test_cycle_mount: the new mount waits for the old daemon's index).
    fx.cycle_mount();
    for ((p, want), h) in cases.iter().zip(&handles) {
        assert_eq!(
            read_handle(&fx.mnt, h).as_deref(),
            Ok(*want),
            "{p} after a cycle mount"
        );
    }
}

/// A file renamed while mounted, and one whose parent directory was renamed, open by their
/// handles after a remount; a file unlinked (and one replaced by a new file of the same
/// name) gives ESTALE, and a file deleted and made again offline in the upper dir, whose
/// inode number the upper filesystem may give again, never opens by the old handle.
#[test]
fn after_a_remount_renamed_files_open_and_unlinked_ones_are_stale() {
    require_root!();
    let mut fx = fixture(|l| {
        write(&l.join("low"), "lower, renamed");
    });
    write(&fx.p("a/moved"), "moved data");
    write(&fx.p("dir/inner"), "inner data");
    write(&fx.p("gone"), "gone data");
    write(&fx.p("replaced"), "old data");
    write(&fx.p("offline"), "offline old");
    let hm = handle_of(&fx.p("a/moved"));
    let hi = handle_of(&fx.p("dir/inner"));
    let hl = handle_of(&fx.p("low"));
    let hg = handle_of(&fx.p("gone"));
    let hr = handle_of(&fx.p("replaced"));
    let ho = handle_of(&fx.p("offline"));
    fs::create_dir(fx.p("b")).unwrap();
    fs::rename(fx.p("a/moved"), fx.p("b/there")).unwrap();
    fs::rename(fx.p("dir"), fx.p("renamed-dir")).unwrap();
    fs::rename(fx.p("low"), fx.p("b/low")).unwrap();
    fs::remove_file(fx.p("gone")).unwrap();
    fs::remove_file(fx.p("replaced")).unwrap();
    write(&fx.p("replaced"), "new file");
    fx.unmount();
    fs::remove_file(fx.upper.join("offline")).unwrap();
    write(&fx.upper.join("offline"), "offline new");
    fx.mount();
    assert_eq!(read_handle(&fx.mnt, &hm).as_deref(), Ok("moved data"));
    assert_eq!(read_handle(&fx.mnt, &hi).as_deref(), Ok("inner data"));
    assert_eq!(read_handle(&fx.mnt, &hl).as_deref(), Ok("lower, renamed"));
    assert_eq!(read_handle(&fx.mnt, &hg), Err(libc::ESTALE), "unlinked");
    assert_eq!(read_handle(&fx.mnt, &hr), Err(libc::ESTALE), "replaced");
    if Impl::current() != Impl::Kernel {
        // Kernel overlayfs follows the upper inode's own handle; an offline change of the
        // upper dir is outside what it promises too.
        assert_eq!(
            read_handle(&fx.mnt, &ho),
            Err(libc::ESTALE),
            "made again offline"
        );
    }
    assert_eq!(fs::read_to_string(fx.p("offline")).unwrap(), "offline new");
}

/// A damaged node index makes the earlier mount's handles ESTALE, never another file's — even
/// once the new mount has given out as many counter ids as the old one. The index is kept while
/// mounted, so a daemon killed with SIGKILL leaves it whole: the killed mount's handles open
/// their files in the next mount, and once those are gone, ESTALE — never a file made since.
#[test]
fn a_corrupt_or_missing_index_gives_estale_not_another_file() {
    require_root!();
    if Impl::current() != Impl::Layercache {
        return;
    }
    let mut fx = fixture(|_| {});
    for i in 0..8 {
        write(&fx.p(&format!("f{i}")), format!("file {i}"));
    }
    let old: Vec<Handle> = (0..8).map(|i| handle_of(&fx.p(&format!("f{i}")))).collect();
    fx.unmount();
    let index = fx.work.join("node-index");
    let mut bytes = fs::read(&index).expect("a mount keeps its node index in the workdir");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x55;
    fs::write(&index, &bytes).unwrap();
    fx.mount();
    assert!(index.exists(), "the new mount's own index");
    // New files: with counter ids starting again, some get the old files' ids.
    for i in 0..8 {
        fs::remove_file(fx.p(&format!("f{i}"))).unwrap();
        write(&fx.p(&format!("g{i}")), format!("other {i}"));
    }
    let newer: Vec<Handle> = (0..8).map(|i| handle_of(&fx.p(&format!("g{i}")))).collect();
    drop_caches();
    for h in &old {
        assert_eq!(read_handle(&fx.mnt, h), Err(libc::ESTALE), "corrupt index");
    }
    // This mount's handles after a kill -9: its index was kept while it served.
    for pid in daemon_pids(&fx.mnt) {
        // SAFETY: kill takes a pid and a signal.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        assert!(wait_exit(pid, 10_000), "daemon {pid} killed");
    }
    fx.unmount();
    assert!(index.exists(), "a killed daemon leaves the index it kept");
    fx.mount();
    for (i, h) in newer.iter().enumerate() {
        assert_eq!(
            read_handle(&fx.mnt, h).as_deref(),
            Ok(format!("other {i}").as_str()),
            "a handle of the killed mount"
        );
    }
    for i in 0..8 {
        fs::remove_file(fx.p(&format!("g{i}"))).unwrap();
        write(&fx.p(&format!("h{i}")), format!("third {i}"));
    }
    drop_caches();
    for h in old.iter().chain(&newer) {
        assert_eq!(
            read_handle(&fx.mnt, h),
            Err(libc::ESTALE),
            "after a killed daemon"
        );
    }
}

/// What a tree holds, tolerant of entries that vanish while it is read (a daemon writing
/// after the umount makes them): one line per path with its type, size and mtime (ns).
fn snapshot(root: &Path) -> Vec<String> {
    fn walk(root: &Path, p: &Path, out: &mut Vec<String>) {
        let rel = p.strip_prefix(root).unwrap().display().to_string();
        let m = match fs::symlink_metadata(p) {
            Ok(m) => m,
            Err(e) => return out.push(format!("{rel}: {e}")),
        };
        out.push(format!(
            "{rel} mode={:o} size={} mtime={}.{}",
            m.mode(),
            m.size(),
            m.mtime(),
            m.mtime_nsec()
        ));
        if m.is_dir() {
            match fs::read_dir(p) {
                Ok(rd) => {
                    let mut names: Vec<_> = rd.flatten().map(|e| e.file_name()).collect();
                    names.sort();
                    for n in names {
                        walk(root, &p.join(n), out);
                    }
                }
                Err(e) => out.push(format!("{rel}/: {e}")),
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out
}

/// Once `umount` returns, layercache writes nothing more in the upper dir or the workdir
/// (issue 31; DESIGN.md "Unmount"), as kernel overlayfs never touches its directories after
/// its unmount: `umount m && rm -rf u w` succeeds every time, and the trees left after the
/// umount are the trees left once the daemon has exited. Each round mounts the real binary
/// over fresh directories, makes what the node index records (files made in the mount, a
/// copy-up, renames, a directory, handles taken, a file unlinked while open), unmounts, and
/// then either removes the upper dir and workdir at once or compares them before and after
/// the daemon exits; rounds alternate FUSE over io_uring and /dev/fuse (`LAYERCACHE_URING`).
/// Before the node index was kept while mounted, the daemon wrote it after the umount, and
/// this failed within a few rounds ("Directory not empty", or a `node-index` appearing).
#[test]
fn nothing_writes_the_upper_or_work_dir_once_umount_returns() {
    require_root!();
    only_layercache!("a test of the daemon's own shutdown");
    const ROUNDS: usize = 40;
    let start = std::time::Instant::now();
    let mut rounds = 0;
    while rounds < ROUNDS && (rounds < 8 || start.elapsed() < std::time::Duration::from_secs(60)) {
        let uring = if rounds % 2 == 0 { "1" } else { "0" };
        let mut fx = Fixture::builder()
            .unmounted()
            .build(|l| write(&l[0].join("d/lower.txt"), "lower data"));
        fx.mount_with(|c| {
            c.env("LAYERCACHE_URING", uring);
        });
        write(&fx.p("d/made.txt"), "made in the mount");
        fs::write(fx.p("d/lower.txt"), "copied up").unwrap();
        fs::create_dir_all(fx.p("new/dir")).unwrap();
        write(&fx.p("new/dir/f"), "f");
        fs::rename(fx.p("d/made.txt"), fx.p("new/moved.txt")).unwrap();
        let _ = handle_of(&fx.p("new/moved.txt"));
        let _ = handle_of(&fx.p("d/lower.txt"));
        let _ = handle_of(&fx.p("new/dir"));
        let open = fs::File::open(fx.p("new/dir/f")).unwrap();
        fs::remove_file(fx.p("new/dir/f")).unwrap();
        drop(open);
        assert_eq!(read(&fx.p("new/moved.txt")), "made in the mount");
        let pids = daemon_pids(&fx.mnt);
        assert!(!pids.is_empty(), "no daemon serves {}", fx.mnt.display());
        run_ok(Command::new("umount").arg(&fx.mnt));
        let what = format!("round {rounds} (LAYERCACHE_URING={uring})");
        if rounds % 4 < 2 {
            // `umount m && rm -rf u w`
            for d in [&fx.upper, &fx.work] {
                if let Err(e) = fs::remove_dir_all(d) {
                    panic!("{what}: rm -rf {} right after umount: {e}", d.display());
                }
            }
        } else {
            let at_umount = (snapshot(&fx.upper), snapshot(&fx.work));
            for &pid in &pids {
                assert!(wait_exit(pid, 10_000), "{what}: daemon {pid} still runs");
            }
            let at_exit = (snapshot(&fx.upper), snapshot(&fx.work));
            assert_eq!(
                at_umount, at_exit,
                "{what}: the upper dir or workdir changed after umount returned"
            );
        }
        for &pid in &pids {
            assert!(wait_exit(pid, 10_000), "{what}: daemon {pid} still runs");
        }
        fx.forget_mount();
        rounds += 1;
    }
    eprintln!("{rounds} rounds in {:?}", start.elapsed());
}

/// The node index is compacted while mounted (here past 4 KiB, `LAYERCACHE_NODE_INDEX_COMPACT`;
/// 8 MiB by default) and stays bounded however many changes it records, and a compacted index
/// still carries the handles over a remount: files renamed many times, a directory renamed,
/// copied-up lower files.
#[test]
fn a_compacted_node_index_stays_small_and_keeps_handles() {
    require_root!();
    only_layercache!("the node index's own compaction");
    let mut fx = Fixture::builder().unmounted().build(|l| {
        for i in 0..20 {
            write(&l[0].join(format!("low/f{i}")), format!("lower {i}"));
        }
    });
    let env = |c: &mut Command| {
        c.env("LAYERCACHE_NODE_INDEX_COMPACT", "4096");
    };
    fx.mount_with(env);
    let index = fx.work.join("node-index");
    let mut handles = Vec::new();
    for i in 0..20 {
        write(&fx.p(&format!("d/up{i}")), format!("upper {i}"));
        fs::write(fx.p(&format!("low/f{i}")), format!("copied {i}")).unwrap();
        handles.push((format!("upper {i}"), handle_of(&fx.p(&format!("d/up{i}")))));
        handles.push((
            format!("copied {i}"),
            handle_of(&fx.p(&format!("low/f{i}"))),
        ));
    }
    let mut largest = 0;
    for round in 0..30 {
        for i in 0..20 {
            let (from, to) = (format!("d/up{i}"), format!("d/up{i}.tmp"));
            let (from, to) = if round % 2 == 0 {
                (from, to)
            } else {
                (to, from)
            };
            fs::rename(fx.p(&from), fx.p(&to)).unwrap();
        }
        largest = largest.max(fs::metadata(&index).unwrap().len());
    }
    // 600 renames of ~80-byte records would be ~48 KiB without compaction.
    assert!(largest < 24 << 10, "node index grew to {largest} bytes");
    fs::rename(fx.p("d"), fx.p("renamed")).unwrap();
    fx.unmount();
    fx.mount_with(env);
    for (want, h) in &handles {
        assert_eq!(
            read_handle(&fx.mnt, h).as_deref(),
            Ok(want.as_str()),
            "after remount"
        );
    }
}

/// Nodes the kernel got from a directory listing (READDIRPLUS, whose node index records are
/// written in one go before its reply) keep their handles over a remount.
#[test]
fn handles_of_listed_files_survive_a_remount() {
    require_root!();
    let mut fx = fixture(|l| {
        for i in 0..50 {
            write(&l.join(format!("d/f{i}")), format!("listed {i}"));
        }
    });
    assert_eq!(names(&fx.p("d")).len(), 50);
    let handles: Vec<Handle> = (0..50)
        .map(|i| handle_of(&fx.p(&format!("d/f{i}"))))
        .collect();
    fx.remount();
    for (i, h) in handles.iter().enumerate() {
        assert_eq!(
            read_handle(&fx.mnt, h).as_deref(),
            Ok(format!("listed {i}").as_str()),
            "d/f{i} after remount"
        );
    }
}
