//! Behaviour xfstests checks that kernel overlayfs has and layercache lacked (issue 25): each
//! test reproduces one generic/NNN failure with a direct syscall check, so the suite catches a
//! regression without xfstests. `LAYERCACHE_TEST_IMPL=kernel` runs them against kernel
//! overlayfs to prove the tests right.

#[macro_use]
mod common;

use std::ffi::CString;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Output};

use common::*;

/// `getxattr(p, name, NULL, 0)`: the size the value needs, or the errno.
fn xattr_size(p: &Path, name: &str) -> Result<usize, i32> {
    let c = cstr(p);
    let n = CString::new(name).unwrap();
    // SAFETY: valid C strings; a null buffer with size 0 asks for the value's size.
    let r = unsafe { libc::lgetxattr(c.as_ptr(), n.as_ptr(), std::ptr::null_mut(), 0) };
    if r < 0 { Err(errno()) } else { Ok(r as usize) }
}

/// `listxattr(p, NULL, 0)` (the size the name list needs) and the length of the list read
/// into a large buffer.
fn xattr_list_sizes(p: &Path) -> (usize, usize) {
    let c = cstr(p);
    // SAFETY: valid C string; a null buffer with size 0 asks for the list's size.
    let asked = unsafe { libc::llistxattr(c.as_ptr(), std::ptr::null_mut(), 0) };
    assert!(asked >= 0, "llistxattr {}: errno {}", p.display(), errno());
    let mut buf = vec![0u8; 65536];
    // SAFETY: buf is writable for its length.
    let got = unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(got >= 0, "llistxattr {}: errno {}", p.display(), errno());
    (asked as usize, got as usize)
}

/// The permission bits of `p` as `stat -c %a` gets them: statx asking STATX_MODE only, which
/// the kernel answers from the attributes it caches (Rust's metadata asks more and refreshes).
fn cached_mode(p: &Path) -> u32 {
    let c = cstr(p);
    // SAFETY: an all-zero statx is a valid out buffer.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string and out pointer.
    let r = unsafe { libc::statx(libc::AT_FDCWD, c.as_ptr(), 0, libc::STATX_MODE, &mut st) };
    assert_eq!(r, 0, "statx {}: errno {}", p.display(), errno());
    st.stx_mode as u32 & 0o7777
}

/// Runs `sh -c script` in `dir` as `uid`:`gid` with no supplementary groups (setpriv).
fn as_user(uid: u32, gid: u32, dir: &Path, script: &str) -> Output {
    Command::new("setpriv")
        .args([
            &format!("--reuid={uid}"),
            &format!("--regid={gid}"),
            "--clear-groups",
            "sh",
            "-c",
            script,
        ])
        .current_dir(dir)
        .output()
        .expect("setpriv")
}

/// generic/020, 037, 062, 097, 337, 523, 533, 618 (`getfattr -d` printed `user.fish=""`) and
/// 633, 688 (security.capability lost): the size query `getxattr(name, NULL, 0)` — what
/// getfattr, `cp -a`, `tar --xattrs`, `rsync -X` and the kernel's own capability read make
/// first — answers the value's length, for a lower file, a copied-up one and a new one; and
/// `listxattr(NULL, 0)` answers the name list's length.
#[test]
fn size_only_getxattr_and_listxattr_answer_the_length() {
    require_root!();
    let fx = Fixture::new(|l| {
        write(&l.join("lower"), "l");
        set_xattr(&l.join("lower"), "user.fish", b"fishval").unwrap();
        write(&l.join("copied"), "c");
        set_xattr(&l.join("copied"), "user.fish", b"fishval").unwrap();
    });
    write(&fx.p("new"), "n");
    set_xattr(&fx.p("new"), "user.fish", b"fishval").unwrap();
    set_xattr(&fx.p("copied"), "user.other", b"12345678901").unwrap();
    for name in ["lower", "copied", "new"] {
        let p = fx.p(name);
        assert_eq!(
            xattr_size(&p, "user.fish"),
            Ok(7),
            "{name}: size of user.fish"
        );
        assert_eq!(
            xattr_size(&p, "user.absent"),
            Err(libc::ENODATA),
            "{name}: size of an absent name"
        );
    }
    assert_eq!(xattr_size(&fx.p("copied"), "user.other"), Ok(11));
    for name in ["lower", "copied", "new"] {
        let (asked, got) = xattr_list_sizes(&fx.p(name));
        // At least "user.fish\0" (10 bytes). The size query may over-estimate (kernel
        // overlayfs counts the names it hides) but never under-estimate.
        assert!(got >= 10, "{name}: listxattr gave {got} bytes");
        assert!(
            asked >= got,
            "{name}: size query of listxattr {asked} < {got}"
        );
    }
    // The kernel reads security.capability with a size query first (vfs_getxattr_alloc);
    // a 0 there made every read of a file capability fail with EINVAL (generic/633, 688).
    let cap = fx.p("new");
    let st = Command::new("setcap")
        .args(["cap_net_raw+ep"])
        .arg(&cap)
        .output();
    let Ok(out) = st else {
        eprintln!("setcap not installed: capability part skipped");
        return;
    };
    assert!(
        out.status.success(),
        "setcap: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = Command::new("getcap").arg(&cap).output().unwrap();
    let text = String::from_utf8_lossy(&got.stdout);
    assert!(
        text.contains("cap_net_raw"),
        "getcap after setcap: {text:?} (stderr {:?})",
        String::from_utf8_lossy(&got.stderr)
    );
}

/// generic/683-685 (and the write and truncate cases of the same rule): a content change by a
/// caller without CAP_FSETID drops S_ISUID, and S_ISGID when the file is group-executable or
/// the caller is not in its group — as the kernel does for ext4 (fs/attr.c); root keeps both.
/// Layercache left S_ISGID of `2666`-style files: the daemon writes as root, and the FUSE
/// kernel module clears S_ISGID only with group-execute.
#[test]
fn unprivileged_content_changes_drop_setid_bits_as_the_kernel_does() {
    require_root!();
    let fx = Fixture::new(|l| {
        fs::create_dir(l.join("d")).unwrap();
        chmod(&l.join("d"), 0o777);
        write(&l.join("d/lower"), vec![b'X'; 192 << 10]);
    });
    let dir = fx.p("d");
    // (mode before, mode after for the user, xfs_io command)
    let cases: &[(u32, u32)] = &[
        (0o6666, 0o0666),
        (0o6676, 0o0676),
        (0o6766, 0o0766),
        (0o6777, 0o0777),
        (0o2676, 0o0676),
        (0o2777, 0o0777),
    ];
    let commands = [
        "falloc 64k 64k",
        "fpunch 64k 64k",
        "fzero 64k 64k",
        "pwrite 0 4k",
        "truncate 100k",
    ];
    for cmd in commands {
        for (i, &(before, after)) in cases.iter().enumerate() {
            // A lower file (copied up by the change) and one made in the mount.
            for name in ["lower", "new"] {
                let f = dir.join(name);
                if name == "new" {
                    write(&f, vec![b'X'; 192 << 10]);
                }
                chmod(&f, before);
                let o = as_user(12345, 12345, &dir, &format!("xfs_io -c '{cmd}' {name}"));
                assert!(
                    o.status.success(),
                    "{cmd} {name}: {}",
                    String::from_utf8_lossy(&o.stderr)
                );
                let m = cached_mode(&f);
                assert_eq!(
                    m, after,
                    "case {i}: `{cmd}` by uid 12345 of a {before:o} {name} file left {m:o} \
                     (as stat -c %a shows it)"
                );
                let m = fs::metadata(&f).unwrap().mode() & 0o7777;
                assert_eq!(
                    m, after,
                    "case {i}: `{cmd}` of a {before:o} {name} file: {m:o}"
                );
                // Root (CAP_FSETID) keeps them.
                chmod(&f, before);
                sh(&dir, &format!("xfs_io -c '{cmd}' {name}"));
                let m = fs::metadata(&f).unwrap().mode() & 0o7777;
                assert_eq!(
                    m, before,
                    "case {i}: `{cmd}` by root of a {before:o} {name} file"
                );
            }
        }
    }
}

/// Mounts `opts` (an overlay option string) at `fx.mnt` with the implementation under test.
fn mount_opts(fx: &mut Fixture, opts: &str) {
    let mut c = match Impl::current() {
        Impl::Layercache => {
            let mut c = Command::new(BIN);
            c.arg("overlay").arg("-o").arg(opts).arg(&fx.mnt);
            c
        }
        Impl::Kernel => {
            let mut c = Command::new("mount");
            c.args(["-t", "overlay", "overlay", "-o", opts])
                .arg(&fx.mnt);
            c
        }
        Impl::FuseOverlayfs => {
            let mut c = Command::new("fuse-overlayfs");
            c.arg("-o").arg(format!("{opts},allow_other")).arg(&fx.mnt);
            c
        }
    };
    run_ok(&mut c);
    fx.adopt_mount();
}

/// Every kind of change to `mnt` (which holds file `f` and directory `d`) fails with EROFS.
fn assert_read_only(mnt: &Path, what: &str) {
    use std::os::unix::fs::PermissionsExt;
    let erofs = |r: std::io::Result<()>, op: &str| {
        let e = r.err().unwrap_or_else(|| panic!("{what}: {op} succeeded"));
        assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{what}: {op}: {e}");
    };
    erofs(fs::write(mnt.join("new"), "x"), "create");
    erofs(
        fs::OpenOptions::new()
            .append(true)
            .open(mnt.join("f"))
            .map(drop),
        "open for writing",
    );
    erofs(fs::create_dir(mnt.join("newdir")), "mkdir");
    erofs(fs::remove_file(mnt.join("f")), "unlink");
    erofs(fs::remove_dir(mnt.join("d")), "rmdir");
    erofs(fs::rename(mnt.join("f"), mnt.join("g")), "rename");
    erofs(
        fs::set_permissions(mnt.join("f"), fs::Permissions::from_mode(0o600)),
        "chmod",
    );
    erofs(set_xattr(&mnt.join("f"), "user.x", b"1"), "setxattr");
    erofs(std::os::unix::fs::symlink("f", mnt.join("link")), "symlink");
    assert_eq!(read(&mnt.join("f")), "lower\n", "{what}: read");
}

/// generic/294, 306, 452: `-o ro` gives a read-only mount (EROFS for every change; layercache
/// refused the option), and layercache writes nothing to the upper dir (kernel overlayfs still
/// records `trusted.overlay.uuid` on it and makes its work dir).
#[test]
fn ro_mount_refuses_every_change() {
    require_root!();
    let mut fx = Fixture::builder().unmounted().build(|l| {
        write(&l[0].join("f"), "lower\n");
        fs::create_dir(l[0].join("d")).unwrap();
    });
    write(&fx.upper.join("up"), "upper\n");
    let before = tree_fingerprint(&fx.upper);
    let opts = format!("{},ro", fx.options());
    mount_opts(&mut fx, &opts);
    assert_read_only(&fx.mnt, "-o ro");
    assert_eq!(read(&fx.p("up")), "upper\n");
    let st = rustix::fs::statvfs(&fx.mnt).unwrap();
    assert!(
        st.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY),
        "statvfs shows a read-only mount"
    );
    fx.unmount();
    only_layercache!("kernel overlayfs writes its uuid xattr to the upper even when ro");
    assert!(
        tree_fingerprint(&fx.upper) == before,
        "the upper dir changed under a read-only mount"
    );
}

/// xfstests generic/120 (and 003's atime cases): per-mount options given at mount time
/// (`noatime`, `nodiratime`, `noexec`) are the mount's own flags, as on any filesystem; they
/// were accepted and dropped (only a remount applied them), so reads updated atimes under
/// `noatime`.
#[test]
fn per_mount_options_are_applied_at_mount() {
    require_root!();
    let mut fx = Fixture::builder().unmounted().build(|l| {
        write(&l[0].join("f"), "lower\n");
    });
    let opts = format!("{},noatime,nodiratime,noexec", fx.options());
    mount_opts(&mut fx, &opts);
    let st = rustix::fs::statvfs(&fx.mnt).unwrap();
    use rustix::fs::StatVfsMountFlags as M;
    for (flag, name) in [
        (M::NOATIME, "noatime"),
        (M::NODIRATIME, "nodiratime"),
        (M::NOEXEC, "noexec"),
    ] {
        assert!(
            st.f_flag.contains(flag),
            "statvfs shows {name}: {:?}",
            st.f_flag
        );
    }
    assert_eq!(read(&fx.p("f")), "lower\n");
}

/// Sets `p`'s atime and mtime (seconds since the epoch) with utimensat(2).
fn set_times(p: &Path, atime: i64, mtime: i64) {
    let c = cstr(p);
    let ts = [
        libc::timespec {
            tv_sec: atime,
            tv_nsec: 0,
        },
        libc::timespec {
            tv_sec: mtime,
            tv_nsec: 0,
        },
    ];
    // SAFETY: valid C string and two timespecs.
    let r = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ts.as_ptr(), 0) };
    assert_eq!(r, 0, "utimensat {}: errno {}", p.display(), errno());
}

/// xfstests generic/003: reads through the mount follow the mount's own atime rule
/// (mount(8) `relatime`, `strictatime`, `noatime`, `nodiratime`, `ro`), as kernel overlayfs
/// applies it to its upper files. FUSE inodes never get an atime update from the kernel
/// (fs/fuse/inode.c sets `S_NOATIME`), so layercache's reads of the upper file decided, under
/// the rule of the mount the upper dir sits on (relatime here): a read under `noatime` updated
/// a new file's atime, and `strictatime` did not update one newer than its mtime (nor a second
/// open's, served from the page cache). Files sit in the upper dir: a "stale" one (atime 2001,
/// older than its mtime: every rule but noatime updates it) and a "fresh" one (atime an hour
/// ahead, newer than its mtime and ctime: only strictatime updates it) — no clock in the test.
#[test]
fn reads_follow_the_mounts_atime_rule() {
    require_root!();
    const STALE: i64 = 1_000_000_000;
    let ahead = || {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        now + 3600
    };
    // (extra mount options, stale file updated, fresh file updated, stale dir updated)
    let cases = [
        ("", true, false, true),
        ("relatime", true, false, true),
        ("noatime", false, false, false),
        ("strictatime", true, true, true),
        ("nodiratime", true, false, false),
        ("strictatime,nodiratime", true, true, false),
        ("ro,strictatime", false, false, false),
    ];
    for (extra, stale_up, fresh_up, dir_up) in cases {
        let mut fx = Fixture::builder().unmounted().build(|_| {});
        write(&fx.upper.join("stale"), "stale\n");
        write(&fx.upper.join("fresh"), "fresh\n");
        fs::create_dir(fx.upper.join("d")).unwrap();
        write(&fx.upper.join("d/x"), "x");
        set_times(&fx.upper.join("stale"), STALE, STALE + 100);
        let fresh_at = ahead();
        set_times(&fx.upper.join("fresh"), fresh_at, STALE);
        set_times(&fx.upper.join("d"), STALE, STALE + 100);
        let opts = if extra.is_empty() {
            fx.options()
        } else {
            format!("{},{extra}", fx.options())
        };
        mount_opts(&mut fx, &opts);
        let atime = |rel: &str| fs::metadata(fx.p(rel)).unwrap().atime();
        assert_eq!(read(&fx.p("stale")), "stale\n");
        assert_eq!(read(&fx.p("fresh")), "fresh\n");
        assert_eq!(names(&fx.p("d")), vec!["x".to_string()]);
        let case = if extra.is_empty() { "(default)" } else { extra };
        assert_eq!(
            atime("stale") != STALE,
            stale_up,
            "-o {case}: stale file's atime updated"
        );
        assert_eq!(
            atime("fresh") != fresh_at,
            fresh_up,
            "-o {case}: fresh file's atime updated"
        );
        assert_eq!(
            atime("d") != STALE,
            dir_up,
            "-o {case}: stale directory's atime updated"
        );
        if fresh_up {
            // Every open's read counts, not only the first one the page cache misses.
            let again = ahead() + 60;
            set_times(&fx.p("fresh"), again, STALE);
            assert_eq!(read(&fx.p("fresh")), "fresh\n");
            assert_ne!(
                atime("fresh"),
                again,
                "-o {case}: second read updates the atime"
            );
        }
    }
}

/// Clears the immutable and append-only flags of the files it names when dropped, so that a
/// failing test still lets its temp dir be removed.
struct ClearFlags(Vec<std::path::PathBuf>);

impl Drop for ClearFlags {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = Command::new("chattr").arg("-ia").arg(p).output();
        }
    }
}

/// `lsattr -d p`'s flag column.
fn lsattr(p: &Path) -> String {
    let out = run_ok(Command::new("lsattr").arg("-d").arg(p));
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// xfstests generic/545, 555: `chattr +i`/`+a` (FS_IOC_SETFLAGS) and `xfs_io chattr +ia`
/// (FS_IOC_FSSETXATTR), which the kernel sends a FUSE daemon as FUSE_IOCTL, were answered
/// ENOSYS ("Function not implemented": the tests did not run). Now a lower file is copied up and
/// its upper file gets the flags, which lsattr shows through the mount, and the upper's
/// filesystem enforces: an immutable file refuses writes, unlinks and renames with EPERM
/// until `chattr -i`; a caller without CAP_LINUX_IMMUTABLE cannot change either flag.
#[test]
fn chattr_immutable_and_append_only_apply_to_the_upper_file() {
    require_root!();
    // e2fsprogs' chattr/lsattr answer no --version: look them up on PATH.
    let on_path = |t: &str| {
        Command::new("sh")
            .args(["-c", &format!("command -v {t}")])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !on_path("chattr") && skip_or_fail("needs chattr and lsattr (e2fsprogs)") {
        return;
    }
    let fx = Fixture::new(|l| {
        write(&l.join("f"), "lower\n");
        write(&l.join("g"), "lower\n");
    });
    let _clear = ClearFlags(vec![
        fx.p("f"),
        fx.p("g"),
        fx.upper.join("f"),
        fx.upper.join("g"),
    ]);
    let chattr = |flags: &str, p: &Path| run_ok(Command::new("chattr").arg(flags).arg(p));
    chattr("+i", &fx.p("f"));
    assert!(
        lsattr(&fx.p("f")).contains('i'),
        "lsattr: {}",
        lsattr(&fx.p("f"))
    );
    let eperm = |r: std::io::Result<()>, op: &str| {
        let e = r
            .err()
            .unwrap_or_else(|| panic!("{op} of an immutable file succeeded"));
        assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{op}: {e}");
    };
    use std::io::Write;
    eperm(
        fs::OpenOptions::new()
            .append(true)
            .open(fx.p("f"))
            .and_then(|mut f| f.write_all(b"x")),
        "append",
    );
    eperm(fs::remove_file(fx.p("f")), "unlink");
    eperm(fs::rename(fx.p("f"), fx.p("h")), "rename");
    assert_eq!(read(&fx.p("f")), "lower\n");
    if Impl::current() == Impl::Layercache {
        assert!(
            lsattr(&fx.upper.join("f")).contains('i'),
            "the upper copy holds the flag"
        );
    }
    if on_path("capsh") {
        for (flags, p) in [("+i", fx.p("g")), ("+a", fx.p("g")), ("-i", fx.p("f"))] {
            let out = Command::new("capsh")
                .arg("--drop=cap_linux_immutable")
                .arg("--")
                .arg("-c")
                .arg(format!("chattr {flags} {}", p.display()))
                .output()
                .unwrap();
            assert!(
                !out.status.success()
                    && String::from_utf8_lossy(&out.stderr).contains("Operation not permitted"),
                "chattr {flags} without CAP_LINUX_IMMUTABLE: {out:?}"
            );
        }
    }
    chattr("-i", &fx.p("f"));
    assert!(!lsattr(&fx.p("f")).contains('i'));
    fs::write(fx.p("f"), "changed\n").unwrap();
    assert_eq!(read(&fx.p("f")), "changed\n");
    chattr("+a", &fx.p("g"));
    assert!(
        lsattr(&fx.p("g")).contains('a'),
        "lsattr: {}",
        lsattr(&fx.p("g"))
    );
    eperm(
        fs::write(fx.p("g"), "over\n"),
        "truncating write of an append-only file",
    );
    chattr("-a", &fx.p("g"));
    fs::remove_file(fx.p("g")).unwrap();
    // A non-empty directory in an immutable or append-only one: the removal is refused as
    // fs/namei.c may_delete refuses it (EACCES/EPERM), before any ENOTEMPTY (generic/079).
    write(&fx.p("d/sub/f"), "f\n");
    let _clear_d = ClearFlags(vec![fx.p("d"), fx.upper.join("d")]);
    for (flag, want) in [
        ("+i", [libc::EACCES, libc::EPERM]),
        ("+a", [libc::EPERM; 2]),
    ] {
        chattr(flag, &fx.p("d"));
        let e = fs::remove_dir(fx.p("d/sub")).expect_err("rmdir in a flagged directory");
        assert!(
            want.contains(&e.raw_os_error().unwrap_or(0)),
            "rmdir of a non-empty directory in a chattr {flag} directory: {e}"
        );
        chattr(&flag.replace('+', "-"), &fx.p("d"));
    }
    fs::remove_dir_all(fx.p("d")).unwrap();
}

/// Kernel overlayfs mounts lower layers alone (no upperdir) read-only: the merged view of the
/// lowers, the root showing the top lower's directory, EROFS for changes.
#[test]
fn lowerdir_only_mount_is_a_read_only_merge() {
    require_root!();
    let mut fx = Fixture::builder().lowers(2).unmounted().build(|l| {
        write(&l[0].join("f"), "lower\n");
        fs::create_dir(l[0].join("d")).unwrap();
        write(&l[1].join("f"), "hidden\n");
        write(&l[1].join("below"), "below\n");
        chmod(&l[0], 0o751);
    });
    let lowers: Vec<String> = fx.lowers.iter().map(|l| l.display().to_string()).collect();
    let opts = format!("lowerdir={}", lowers.join(":"));
    mount_opts(&mut fx, &opts);
    assert_eq!(read(&fx.p("below")), "below\n");
    assert_eq!(
        names(&fx.mnt),
        vec!["below".to_string(), "d".into(), "f".into()]
    );
    let root = fs::metadata(&fx.mnt).unwrap();
    assert_eq!(root.mode() & 0o7777, 0o751, "root mode is the top lower's");
    assert_read_only(&fx.mnt, "lowerdir only");
}

/// generic/294, 306, 452: `mount -o remount,ro` makes a writable mount read-only and
/// `remount,rw` writable again. The kernel flips the superblock itself (`mount -i`, no helper);
/// plain mount(8) hands a FUSE remount to mount.fuse3, which runs the filesystem's binary with
/// `-o …,remount,…` — layercache refused that (unknown option, then "ro" not supported).
#[test]
fn remount_ro_and_back_to_rw() {
    require_root!();
    let fx = Fixture::new(|l| {
        write(&l.join("f"), "lower\n");
        fs::create_dir(l.join("d")).unwrap();
    });
    let by_kernel = |how: &str| {
        run_ok(
            Command::new("mount")
                .args(["-i", "-o", &format!("remount,{how}")])
                .arg(&fx.mnt),
        );
    };
    // What mount.fuse3 runs for `mount -o remount,ro MNT` (its arguments, seen with strace).
    let by_helper = |how: &str| {
        let opts = format!(
            "{how},nosuid,nodev,relatime,remount,user_id=0,group_id=0,default_permissions,allow_other"
        );
        run_ok(
            Command::new(BIN)
                .arg("layercache:/somewhere/upper")
                .arg(&fx.mnt)
                .args(["-o", &opts]),
        );
    };
    let mut n = 0;
    for helper in [false, true] {
        if helper && Impl::current() != Impl::Layercache {
            break;
        }
        let remount = |how: &str| {
            if helper {
                by_helper(how)
            } else {
                by_kernel(how)
            }
        };
        remount("ro");
        assert_read_only(
            &fx.mnt,
            if helper {
                "helper remount,ro"
            } else {
                "remount,ro"
            },
        );
        remount("rw");
        n += 1;
        let name = format!("new{n}");
        fs::write(fx.p(&name), "x").unwrap();
        assert_eq!(read(&fx.p(&name)), "x");
    }
}

/// Makes character device 1:3 (/dev/null's) at `p` and writes to it; the errno of opening it.
fn open_made_null(p: &Path) -> Result<(), i32> {
    let c = cstr(p);
    // SAFETY: valid C string; mknod of a character device as root.
    let r = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
    assert_eq!(r, 0, "mknod {}: errno {}", p.display(), errno());
    match fs::OpenOptions::new().write(true).open(p) {
        Ok(mut f) => {
            use std::io::Write;
            f.write_all(b"gone").unwrap();
            Ok(())
        }
        Err(e) => Err(e.raw_os_error().unwrap_or(-1)),
    }
}

/// generic/184, 434: with `-o dev` (kernel overlayfs's default) a device node made in the
/// mount can be opened; without it layercache's mount stays `nodev` (EACCES).
#[test]
fn dev_option_lets_device_nodes_open() {
    require_root!();
    let mut fx = Fixture::builder().unmounted().build(|_| {});
    let opts = format!("{},dev", fx.options());
    mount_opts(&mut fx, &opts);
    assert_eq!(open_made_null(&fx.p("null")), Ok(()), "-o dev");
    fx.unmount();
    only_layercache!("nodev is layercache's default");
    fx.mount();
    assert_eq!(
        open_made_null(&fx.p("null2")),
        Err(libc::EACCES),
        "the default mount is nodev"
    );
}

/// generic/099, 319, 444 (default ACLs), 375 (setfacl and the mode, S_ISGID), and access
/// checks by ACL: POSIX ACLs through the mount behave as on the upper's own filesystem.
#[test]
fn posix_acls_apply_on_create_change_the_mode_and_grant_access() {
    require_root!();
    let fx = Fixture::new(|l| {
        fs::create_dir(l.join("lowerdir")).unwrap();
        write(&l.join("secret"), "s\n");
        chmod(&l.join("secret"), 0o600);
    });
    fs::create_dir(fx.p("acldir")).unwrap();
    for dir in ["acldir", "lowerdir"] {
        // A default ACL granting everything: new entries get it instead of the umask.
        sh(
            &fx.mnt,
            &format!("setfacl -d -m u::rwx,g::rwx,o::rwx {dir}"),
        );
        sh(
            &fx.mnt,
            &format!("umask 077 && touch {dir}/file && mkdir {dir}/sub && mkfifo {dir}/fifo"),
        );
        for (name, want) in [("file", 0o666), ("sub", 0o777), ("fifo", 0o666)] {
            let m = fs::metadata(fx.p(&format!("{dir}/{name}"))).unwrap().mode() & 0o7777;
            assert_eq!(m, want, "{dir}/{name}: default ACL, not the umask");
        }
        // A subdirectory inherits the default ACL itself.
        let acl = sh(&fx.mnt, &format!("getfacl -c -d {dir}/sub"));
        assert!(acl.contains("other::rwx"), "{dir}/sub default ACL: {acl}");
    }
    // Without a default ACL the umask applies.
    sh(&fx.mnt, "umask 027 && touch plain && mkdir plaindir");
    assert_eq!(fs::metadata(fx.p("plain")).unwrap().mode() & 0o777, 0o640);
    assert_eq!(
        fs::metadata(fx.p("plaindir")).unwrap().mode() & 0o777,
        0o750
    );
    // generic/375: setfacl of the base entries is a chmod that stat shows at once.
    write(&fx.p("f"), "x");
    chmod(&fx.p("f"), 0o644);
    assert_eq!(fs::metadata(fx.p("f")).unwrap().mode() & 0o777, 0o644);
    sh(&fx.mnt, "setfacl -m u::rwx,g::rwx,o::rwx f");
    assert_eq!(fs::metadata(fx.p("f")).unwrap().mode() & 0o777, 0o777);
    // ... and by an owner outside the file's group it drops S_ISGID (in the group: kept).
    for (gid, want) in [(100, 0o2777), (101, 0o0777)] {
        chown(&fx.p("f"), 100, 100);
        chmod(&fx.p("f"), 0o2755);
        let o = as_user(100, gid, &fx.mnt, "setfacl -m u::rwx,g::rwx,o::rwx f");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let m = fs::metadata(fx.p("f")).unwrap().mode() & 0o7777;
        assert_eq!(
            m, want,
            "setfacl by 100:{gid} of a 2755 file owned by 100:100"
        );
    }
    // An ACL entry grants access the mode bits do not (the kernel checks it).
    let o = as_user(12345, 12345, &fx.mnt, "cat secret");
    assert!(
        !o.status.success(),
        "0600 root file readable by uid 12345 without an ACL"
    );
    sh(&fx.mnt, "setfacl -m u:12345:r secret");
    let o = as_user(12345, 12345, &fx.mnt, "cat secret");
    assert!(
        o.status.success(),
        "u:12345:r ACL: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// generic/633 (vfstest setgid_create): entries made in a setgid directory get its group, and
/// keep the S_ISGID they were made with — a device node and a fifo too (the daemon's chown to
/// the caller cleared it; only files and directories had their mode put back).
#[test]
fn entries_made_in_a_setgid_directory_keep_their_mode() {
    require_root!();
    let fx = Fixture::new(|l| fs::create_dir(l.join("d")).unwrap());
    let d = fx.p("d");
    chown(&d, 0, 4321);
    chmod(&d, 0o2777);
    for (name, kind, dev) in [
        ("chr", libc::S_IFCHR, libc::makedev(5, 1)),
        ("fifo", libc::S_IFIFO, 0),
        ("reg", libc::S_IFREG, 0),
    ] {
        let p = d.join(name);
        let c = cstr(&p);
        // SAFETY: valid C string; mknod as root.
        let r = unsafe { libc::mknod(c.as_ptr(), kind | libc::S_ISGID | libc::S_IXGRP, dev) };
        assert_eq!(r, 0, "mknod {name}: errno {}", errno());
        let m = fs::symlink_metadata(&p).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o2010, "{name}: mode");
        assert_eq!(m.gid(), 4321, "{name}: the setgid directory's group");
    }
}

/// generic/633 (vfstest "setid binaries on regular mounts"): with `-o suid` (kernel overlayfs's
/// default) a set-user-ID program in the mount runs with its owner's uid; without it
/// layercache's mount stays `nosuid`.
#[test]
fn suid_option_lets_setuid_programs_run_as_their_owner() {
    require_root!();
    let mut fx = Fixture::builder().unmounted().build(|_| {});
    let euid_of_setuid_id = |fx: &Fixture, name: &str| {
        let p = fx.p(name);
        fs::copy("/usr/bin/id", &p).unwrap();
        chmod(&p, 0o4755);
        let o = as_user(12345, 12345, &fx.mnt, &format!("./{name} -u"));
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    let opts = format!("{},suid", fx.options());
    mount_opts(&mut fx, &opts);
    assert_eq!(euid_of_setuid_id(&fx, "id1"), "0", "-o suid");
    fx.unmount();
    only_layercache!("nosuid is layercache's default");
    fx.mount();
    assert_eq!(
        euid_of_setuid_id(&fx, "id2"),
        "12345",
        "the default mount is nosuid"
    );
}

/// `chattr +A`, `+i`, `+a` (include/uapi/linux/fs.h).
const FS_NOATIME_FL: i32 = 0x80;
const FS_IMMUTABLE_FL: i32 = 0x10;
const FS_APPEND_FL: i32 = 0x20;

/// `FS_IOC_GETFLAGS`/`FS_IOC_SETFLAGS` (include/uapi/linux/fs.h) on an open `f`.
fn inode_flags(f: &fs::File) -> i32 {
    let mut flags: libc::c_int = 0;
    // SAFETY: FS_IOC_GETFLAGS writes one int through the pointer.
    let r = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(f),
            libc::FS_IOC_GETFLAGS,
            &mut flags,
        )
    };
    assert_eq!(r, 0, "FS_IOC_GETFLAGS: errno {}", errno());
    flags
}

fn set_inode_flags(f: &fs::File, flags: i32) -> Result<(), i32> {
    // SAFETY: FS_IOC_SETFLAGS reads one int through the pointer.
    let r = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(f),
            libc::FS_IOC_SETFLAGS,
            &flags,
        )
    };
    if r == 0 { Ok(()) } else { Err(errno()) }
}

/// `(st_ctime, st_ctime_nsec)` by stat(2), which the kernel answers from the attributes it
/// caches while they are valid (a FUSE mount's for an hour).
fn cached_ctime(p: &Path) -> (i64, i64) {
    let c = cstr(p);
    // SAFETY: an all-zero stat is a valid out buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string and out pointer.
    let r = unsafe { libc::stat(c.as_ptr(), &mut st) };
    assert_eq!(r, 0, "stat {}: errno {}", p.display(), errno());
    (st.st_ctime, st.st_ctime_nsec)
}

/// generic/277: a flags change (`chattr +A`, FS_IOC_SETFLAGS) moves the file's ctime, and stat
/// through the mount shows it at once — for a file made in the mount and for a lower file the
/// change copies up. The kernel sends FUSE_IOCTL and keeps the attributes it cached
/// (fs/fuse/ioctl.c invalidates none): the daemon must tell it (FUSE_NOTIFY_INVAL_INODE).
#[test]
fn a_flags_change_moves_ctime_and_stat_shows_it() {
    require_root!();
    let fx = Fixture::new(|l| write(&l.join("lower"), "lower\n"));
    write(&fx.p("upper"), "upper\n");
    for name in ["upper", "lower"] {
        let p = fx.p(name);
        let f = fs::File::open(&p).unwrap();
        let flags = inode_flags(&f);
        let before = cached_ctime(&p);
        // Past the upper filesystem's timestamp granularity (a jiffy at most).
        std::thread::sleep(std::time::Duration::from_millis(30));
        set_inode_flags(&f, flags | FS_NOATIME_FL)
            .unwrap_or_else(|e| panic!("FS_IOC_SETFLAGS {name}: errno {e}"));
        // A new open, as lsattr makes (in passthrough mode the fd opened before the copy-up
        // stays the lower file's, and FUSE_IOCTL's own OPEN of it is ESTALE then).
        let again = fs::File::open(&p).unwrap();
        assert_ne!(inode_flags(&again) & FS_NOATIME_FL, 0, "{name}: +A");
        let after = cached_ctime(&p);
        assert!(
            after > before,
            "{name}: ctime {after:?} after the flags change, {before:?} before"
        );
    }
}

/// open(2) of `p` with `flags`: the errno when it fails.
fn open_errno(p: &Path, flags: i32) -> Result<fs::File, i32> {
    let c = cstr(p);
    // SAFETY: valid C string; the fd returned is owned by the File.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: a new fd we own.
    Ok(unsafe { <fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

/// generic/079 (t_immutable): an immutable file (`chattr +i`) refuses open(2) for writing and
/// an append-only one (`chattr +a`) refuses it without `O_APPEND`, with EPERM; the append-only
/// file takes appends. Where OPEN reaches the daemon — passthrough mode
/// (`LAYERCACHE_PASSTHROUGH=1`) and `strictatime` mounts, which this test uses — it refuses
/// the opens as the kernel does. In layercache's default no-open mode the kernel opens without
/// asking the daemon (FUSE has no attribute for the flags), so the open succeeds and the
/// first write is refused instead: the mode's documented limit, checked here too.
#[test]
fn immutable_and_append_only_files_refuse_opens_for_writing() {
    require_root!();
    let mut fx = Fixture::builder().unmounted().build(|l| {
        write(&l[0].join("imm"), "immutable\n");
        write(&l[0].join("app"), "append\n");
    });
    let _clear = ClearFlags(vec![
        fx.upper.join("imm"),
        fx.upper.join("app"),
        fx.p("imm"),
        fx.p("app"),
    ]);
    let set = |p: &Path, flag: i32| {
        let f = fs::File::open(p).unwrap();
        let flags = inode_flags(&f);
        set_inode_flags(&f, flags | flag).unwrap_or_else(|e| panic!("chattr: errno {e}"));
    };
    let clear = |p: &Path| {
        let f = fs::File::open(p).unwrap();
        let flags = inode_flags(&f);
        set_inode_flags(&f, flags & !(FS_IMMUTABLE_FL | FS_APPEND_FL)).unwrap();
    };
    use std::io::Write;
    // Both modes: the append-only file takes appends, and no write reaches either file.
    let appends_and_refuses_writes = |fx: &Fixture| {
        let before = read(&fx.p("app"));
        let mut a = open_errno(&fx.p("app"), libc::O_WRONLY | libc::O_APPEND)
            .unwrap_or_else(|e| panic!("O_APPEND open of an append-only file: errno {e}"));
        a.write_all(b"more\n")
            .expect("append to an append-only file");
        a.sync_all().expect("fsync of an append-only file");
        drop(a);
        assert_eq!(read(&fx.p("app")), format!("{before}more\n"));
        if let Ok(mut f) = open_errno(&fx.p("imm"), libc::O_RDWR) {
            let e = f.write_all(b"x").and_then(|()| f.sync_all()).unwrap_err();
            assert_eq!(
                e.raw_os_error(),
                Some(libc::EPERM),
                "write to an immutable file"
            );
        }
        assert_eq!(read(&fx.p("imm")), "immutable\n");
    };
    let opts = format!("{},strictatime", fx.options());
    mount_opts(&mut fx, &opts);
    set(&fx.p("imm"), FS_IMMUTABLE_FL);
    set(&fx.p("app"), FS_APPEND_FL);
    for (name, flags) in [
        ("imm", libc::O_RDWR),
        ("imm", libc::O_WRONLY | libc::O_APPEND),
        ("app", libc::O_WRONLY),
        ("app", libc::O_RDWR),
    ] {
        assert_eq!(
            open_errno(&fx.p(name), flags).map(drop),
            Err(libc::EPERM),
            "open {name} with flags {flags:#o}"
        );
    }
    appends_and_refuses_writes(&fx);
    fx.unmount();
    if Impl::current() != Impl::Layercache || passthrough_mode() {
        return;
    }
    // The default (no-open) mode.
    fx.mount();
    let opened = open_errno(&fx.p("imm"), libc::O_RDWR).map(drop);
    eprintln!("no-open mode: O_RDWR open of an immutable file: {opened:?} (the mode's limit)");
    appends_and_refuses_writes(&fx);
    clear(&fx.p("imm"));
    clear(&fx.p("app"));
    fs::remove_file(fx.p("imm")).unwrap();
}

/// statx(2) of `p` asking `mask` (not following a last symlink).
fn statx_of(p: &Path, mask: u32) -> libc::statx {
    let c = cstr(p);
    // SAFETY: an all-zero statx is a valid out buffer.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string and out pointer.
    let r = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
            mask,
            &mut st,
        )
    };
    assert_eq!(r, 0, "statx {}: errno {}", p.display(), errno());
    st
}

/// generic/528 ("inode creation time not supported"): statx(STATX_BTIME) through the mount
/// gives the birth time of the file's real inode — the lower file's, or the upper file's for a
/// file made in the mount or copied up — along with the same basic fields as stat(2), for a
/// file, a directory, a symlink and a device node. The kernel sends FUSE_STATX for it.
#[test]
fn statx_shows_birth_time_and_the_basic_fields() {
    require_root!();
    let fx = Fixture::new(|l| {
        write(&l.join("lower"), "lower");
        write(&l.join("copied"), "lower");
        fs::create_dir(l.join("dir")).unwrap();
        std::os::unix::fs::symlink("lower", l.join("link")).unwrap();
    });
    let btime = |st: &libc::statx| {
        assert_ne!(
            st.stx_mask & libc::STATX_BTIME,
            0,
            "STATX_BTIME in the reply's mask"
        );
        (st.stx_btime.tv_sec, st.stx_btime.tv_nsec)
    };
    let all = libc::STATX_BASIC_STATS | libc::STATX_BTIME;
    if statx_of(fx.lower(), all).stx_mask & libc::STATX_BTIME == 0 {
        skip_or_fail("the lower's filesystem keeps no birth time");
        return;
    }
    for name in ["lower", "dir", "link"] {
        let (m, l) = (
            statx_of(&fx.p(name), all),
            statx_of(&fx.lower().join(name), all),
        );
        assert_eq!(btime(&m), btime(&l), "{name}: the lower inode's birth time");
        let st = fs::symlink_metadata(fx.p(name)).unwrap();
        assert_eq!(
            (m.stx_ino, m.stx_mode as u32, m.stx_nlink, m.stx_size),
            (st.ino(), st.mode(), st.nlink() as u32, st.size()),
            "{name}: basic fields as stat(2) gives them"
        );
        assert_eq!((m.stx_uid, m.stx_gid), (st.uid(), st.gid()), "{name}");
    }
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    write(&fx.p("new"), "made here");
    fs::write(fx.p("copied"), "copied up").unwrap();
    for name in ["new", "copied"] {
        let m = statx_of(&fx.p(name), all);
        let u = statx_of(&fx.upper.join(name), all);
        assert_eq!(btime(&m), btime(&u), "{name}: the upper file's birth time");
        assert!(
            btime(&m).0 >= before - 1,
            "{name}: born now, {:?}",
            btime(&m)
        );
    }
    let c = cstr(&fx.p("dev"));
    // SAFETY: valid C string; mknod as root (the mount is nodev: the node cannot be opened,
    // its attributes can be read).
    let r = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o644, libc::makedev(1, 3)) };
    assert_eq!(r, 0, "mknod: errno {}", errno());
    let d = statx_of(&fx.p("dev"), all);
    assert_eq!(
        (d.stx_rdev_major, d.stx_rdev_minor),
        (1, 3),
        "device numbers"
    );
}
