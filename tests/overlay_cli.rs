//! The `layercache overlay` command line: bad input is rejected with one clear line and exit
//! status 2 without mounting or changing anything; `mount -t fuse.layercache` works; the usual
//! unmount commands end a mount (issue 2, "Interface").

#[macro_use]
mod common;

use std::fs;
use std::path::Path;
use std::process::Command;

use common::*;

/// Runs `layercache overlay -o OPTS MNT` expecting a rejection: exit 2, one non-empty line on
/// stderr that contains `needle`, no new mount at `mnt`, lower and upper unchanged.
fn expect_rejected(fx: &Fixture, opts: &str, mnt: &Path, needle: &str) {
    let upper_before = tree_fingerprint(&fx.upper);
    let mounts_before = mounts_at(mnt);
    let out = Command::new(BIN)
        .args(["overlay", "-o", opts])
        .arg(mnt)
        .output()
        .unwrap();
    if mounts_at(mnt) > mounts_before {
        lazy_umount(mnt);
        panic!("-o {opts}: mounted although the input is bad");
    }
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "-o {opts}: exit status (stderr: {err})"
    );
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        lines.len(),
        1,
        "-o {opts}: want one error line, got {err:?}"
    );
    assert!(
        lines[0].contains(needle),
        "-o {opts}: the error should name {needle:?}: {err:?}"
    );
    assert!(
        tree_fingerprint(&fx.upper) == upper_before,
        "-o {opts}: upper dir changed"
    );
    fx.assert_lower_unchanged();
}

fn unmounted_fixture() -> Fixture {
    Fixture::builder().unmounted().build(|l| {
        write(&l[0].join("f"), "f");
        fs::create_dir(l[0].join("inside")).unwrap();
    })
}

#[test]
fn bad_input_missing_directories() {
    require_root!();
    only_layercache!("layercache's own command line");
    let fx = unmounted_fixture();
    let (l, u, w) = (fx.lower().display(), fx.upper.display(), fx.work.display());
    let missing = "/nonexistent/layercache-test-dir";
    expect_rejected(
        &fx,
        &format!("lowerdir={missing},upperdir={u},workdir={w}"),
        &fx.mnt,
        missing,
    );
    expect_rejected(
        &fx,
        &format!("lowerdir={l}:{missing},upperdir={u},workdir={w}"),
        &fx.mnt,
        missing,
    );
    expect_rejected(
        &fx,
        &format!("lowerdir={l},upperdir={missing},workdir={w}"),
        &fx.mnt,
        missing,
    );
    expect_rejected(
        &fx,
        &format!("upperdir={u},workdir={w}"),
        &fx.mnt,
        "lowerdir",
    );
    let nomnt = fx.mnt.join("missing-mountpoint");
    expect_rejected(&fx, &fx.options(), &nomnt, "missing-mountpoint");
}

#[test]
fn bad_input_upper_inside_lower_and_lower_inside_upper() {
    require_root!();
    only_layercache!("layercache's own command line");
    let fx = unmounted_fixture();
    let (l, u, w) = (fx.lower().display(), fx.upper.display(), fx.work.display());
    let inside = fx.lower().join("inside");
    let inside = inside.display();
    expect_rejected(
        &fx,
        &format!("lowerdir={l},upperdir={inside},workdir={w}"),
        &fx.mnt,
        &inside.to_string(),
    );
    fs::create_dir(fx.upper.join("low")).unwrap();
    let low = fx.upper.join("low");
    expect_rejected(
        &fx,
        &format!("lowerdir={},upperdir={u},workdir={w}", low.display()),
        &fx.mnt,
        "upper",
    );
}

/// A mountpoint below a lower (`lowerdir=/x … /x/sub`) is refused by name, not mounted to
/// show itself recursively; a refused mount leaves no workdir behind (given or the default
/// one beside the upper).
#[test]
fn bad_input_mountpoint_inside_a_lower_and_no_workdir_left() {
    require_root!();
    only_layercache!("layercache's own command line");
    let fx = unmounted_fixture();
    let x = fx.upper.with_file_name("x");
    let sub = x.join("sub");
    fs::create_dir_all(&sub).unwrap();
    let (l, u) = (x.display(), fx.upper.display());
    let work = fx.upper.with_file_name("fresh-work");
    let opts = format!("lowerdir={l},upperdir={u},workdir={}", work.display());
    expect_rejected(&fx, &opts, &sub, "is inside lowerdir");
    assert!(!work.exists(), "a refused mount made its workdir");
    let nomnt = fx.mnt.join("missing-mountpoint");
    expect_rejected(&fx, &opts, &nomnt, "missing-mountpoint");
    assert!(!work.exists(), "a refused mount made its workdir");
    let default_work = fx.upper.with_file_name(format!(
        ".{}.layercache-work",
        fx.upper.file_name().unwrap().to_string_lossy()
    ));
    let had_default = default_work.exists();
    expect_rejected(
        &fx,
        &format!("lowerdir={l},upperdir={u}"),
        &nomnt,
        "missing-mountpoint",
    );
    assert_eq!(
        default_work.exists(),
        had_default,
        "a refused mount made the default workdir"
    );
}

#[test]
fn bad_input_unknown_option() {
    require_root!();
    only_layercache!("layercache's own command line");
    let fx = unmounted_fixture();
    expect_rejected(
        &fx,
        &format!("{},frobnicate=1", fx.options()),
        &fx.mnt,
        "frobnicate",
    );
    expect_rejected(
        &fx,
        &format!("{},bogus_flag", fx.options()),
        &fx.mnt,
        "bogus_flag",
    );
}

#[test]
fn bad_input_busy_mountpoint() {
    require_root!();
    only_layercache!("layercache's own command line");
    let mut fx = unmounted_fixture();
    fx.mount();
    write(&fx.p("made"), "x");
    expect_rejected(&fx, &fx.options(), &fx.mnt, &fx.mnt.display().to_string());
    // Refused after the option checks (busy is found when mounting): the workdir it made goes.
    let fresh = fx.upper.with_file_name("fresh-work");
    let opts = format!(
        "lowerdir={},upperdir={},workdir={}",
        fx.lower().display(),
        fx.upper.display(),
        fresh.join("w").display()
    );
    expect_rejected(&fx, &opts, &fx.mnt, "busy");
    assert!(!fresh.exists(), "a refused mount left its workdir");
    assert_eq!(mounts_at(&fx.mnt), 1, "exactly one mount at the mountpoint");
    assert_eq!(read(&fx.p("made")), "x", "the first mount still serves");
}

/// Mounts `fx` with `layercache overlay [EXTRA…] -o OPTIONS MNT` and the environment `envs`,
/// adopts the mount and checks it succeeded and serves the fixture's file.
fn overlay_serving(fx: &mut Fixture, extra: &[&str], envs: &[(&str, &str)]) {
    let out = Command::new(BIN)
        .arg("overlay")
        .args(extra)
        .args(["-o", &fx.options()])
        .arg(&fx.mnt)
        .envs(envs.iter().copied())
        .output()
        .unwrap();
    fx.adopt_mount();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(read(&fx.p("f")), "f");
}

#[test]
fn generic_mount_options_are_accepted() {
    require_root!();
    only_layercache!("layercache's own command line");
    let mut fx = unmounted_fixture();
    overlay_serving(&mut fx, &["-o", "rw,noatime,lazytime,allow_other"], &[]);
    let line = fs::read_to_string("/proc/mounts")
        .unwrap()
        .lines()
        .find(|l| l.split(' ').nth(1) == Some(&*fx.mnt.display().to_string()))
        .map(str::to_string)
        .unwrap();
    for want in ["nosuid", "nodev", "allow_other", "default_permissions"] {
        assert!(line.contains(want), "mount options lack {want}: {line}");
    }
}

/// Runs a mount command that should end up running `layercache overlay MNT -o …`, adopts the
/// mount and checks it serves and persists into the upper.
fn mount_through_helper(mut cmd: Command, what: &str) {
    let mut fx = unmounted_fixture();
    let out = cmd
        .arg(&fx.mnt)
        .args(["-o", &format!("{},noatime", fx.options())])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    if mounts_at(&fx.mnt) > 0 {
        fx.adopt_mount();
    }
    assert!(out.status.success(), "{what}: {err}");
    assert!(
        fx.is_mounted(),
        "{what} returned success but nothing is mounted"
    );
    assert_eq!(read(&fx.p("f")), "f");
    write(&fx.p("g"), "g");
    fx.unmount();
    assert_eq!(read(&fx.upper.join("g")), "g");
}

/// `mount -t fuse.layercache overlay MNT -o …` makes mount(8) run `mount.fuse3 overlay MNT -o …
/// -t fuse.layercache`, which runs `layercache overlay MNT -o …` through /bin/sh. mount(8)
/// drops PATH from the helper's environment (sh then searches its default directories), so
/// this test calls mount.fuse3 itself with a PATH holding a symlink to the built binary.
#[test]
fn mount_fuse3_helper_runs_layercache_overlay() {
    require_root!();
    only_layercache!("mount -t fuse.layercache runs the layercache binary");
    let (cmd, _bin) = mount_fuse3("overlay");
    mount_through_helper(cmd, "mount.fuse3 overlay MNT -t fuse.layercache");
}

/// `sh -c 'exec mount.fuse3 SOURCE MNT -t fuse.layercache -o OPTS'` with a PATH that finds the
/// built binary as `layercache` (in the returned temp dir, to keep while the command runs).
/// mount.fuse3 SOURCE MOUNTPOINT [-t TYPE] [-o OPTS] is how mount(8) calls it; sh reorders the
/// arguments mount_through_helper appends (MNT -o OPTS).
fn mount_fuse3(source: &str) -> (Command, tempfile::TempDir) {
    let bin = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(BIN, bin.path().join("layercache")).unwrap();
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into())
    );
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!(
            "exec mount.fuse3 {source} \"$1\" -t fuse.layercache -o \"$3\""
        ))
        .arg("sh")
        .env("PATH", path);
    (cmd, bin)
}

/// `mount -t fuse.layercache SOURCE …` with any SOURCE (`layercache` here, what
/// unionmount-testsuite and most fstab lines use): mount.fuse3 passes SOURCE first, and
/// layercache takes it as the overlay command, ignoring the source as fuse-overlayfs does.
#[test]
fn mount_fuse3_helper_accepts_any_source() {
    require_root!();
    only_layercache!("mount -t fuse.layercache runs the layercache binary");
    let (cmd, _bin) = mount_fuse3("layercache");
    mount_through_helper(cmd, "mount.fuse3 layercache MNT -t fuse.layercache");
}

/// An fstab-style line (`PROGRAM#SOURCE MNT fuse OPTIONS 0 0`) with a SOURCE that is no
/// subcommand, mounted by `mount -T FSTAB MNT`.
#[test]
fn fstab_line_with_any_source_mounts() {
    require_root!();
    only_layercache!("mount -T runs the layercache binary");
    let mut fx = unmounted_fixture();
    let tab = tempfile::NamedTempFile::new().unwrap();
    let line = format!(
        "{BIN}#layercache {} fuse {},noatime 0 0\n",
        fx.mnt.display(),
        fx.options()
    );
    fs::write(tab.path(), line).unwrap();
    let out = Command::new("mount")
        .arg("-T")
        .arg(tab.path())
        .arg(&fx.mnt)
        .output()
        .unwrap();
    if mounts_at(&fx.mnt) > 0 {
        fx.adopt_mount();
    }
    assert!(
        out.status.success(),
        "mount -T: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(read(&fx.p("f")), "f");
    write(&fx.p("g"), "g");
    fx.unmount();
    assert_eq!(read(&fx.upper.join("g")), "g");
}

/// The same path through mount(8) itself, naming the program explicitly (`-t fuse
/// PROGRAM#SOURCE`), which needs no PATH lookup.
#[test]
fn mount_t_fuse_program_hash_source() {
    require_root!();
    only_layercache!("mount -t fuse runs the layercache binary");
    let mut cmd = Command::new("mount");
    cmd.args(["-t", "fuse"]).arg(format!("{BIN}#overlay"));
    mount_through_helper(cmd, "mount -t fuse layercache#overlay");
}

#[test]
fn fusermount3_u_ends_the_mount() {
    require_root!();
    skip_for!(Impl::Kernel, "fusermount3 only unmounts FUSE filesystems");
    let mut fx = unmounted_fixture();
    fx.mount();
    write(&fx.p("g"), "written");
    // umount2 without MNT_DETACH answers EBUSY while anything holds a reference to the mount,
    // including a peer copy another process's new mount namespace (unshare -m, bwrap, a
    // run's steps) has not yet made private: a real answer on a busy machine, so a bounded
    // retry of EBUSY only (seen once in a full suite run beside other work).
    let mut tries = 0;
    loop {
        let out = Command::new("fusermount3")
            .arg("-u")
            .arg(&fx.mnt)
            .output()
            .unwrap();
        let busy = String::from_utf8_lossy(&out.stderr).contains("busy");
        if out.status.success() || !busy || tries == 50 {
            assert!(out.status.success(), "fusermount3 -u: {out:?}");
            break;
        }
        tries += 1;
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(!is_mounted(&fx.mnt), "still mounted after fusermount3 -u");
    assert_eq!(mounts_at(&fx.mnt), 0);
    assert_eq!(
        read(&fx.upper.join("g")),
        "written",
        "upper consistent after unmount"
    );
    // The guard has nothing left to do; mount again to check the upper is reusable.
    fx.forget_mount();
    fx.mount();
    assert_eq!(read(&fx.p("g")), "written");
}

/// After `umount MNT` the old daemon must not touch MNT again: when it exits late (here: it
/// is stopped right after umount returns, until a new mount is made at the same place) it must
/// not unmount the new mount. (Stopping it before umount would block umount itself, which
/// waits for the daemon's answer.)
#[test]
fn old_daemon_exit_does_not_unmount_a_new_mount() {
    require_root!();
    skip_for!(Impl::Kernel, "no daemon");
    let mut fx = unmounted_fixture();
    let mut conclusive = 0;
    for _ in 0..10 {
        fx.mount();
        let old = daemon_pids(&fx.mnt);
        assert!(!old.is_empty(), "no daemon found for {}", fx.mnt.display());
        let out = Command::new("umount").arg(&fx.mnt).output().unwrap();
        // Checked before stopping the daemon: a failed umount (EBUSY under load) leaves the
        // mount, and the guard's unmount would wait forever on a stopped daemon.
        assert!(
            out.status.success(),
            "umount: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // SAFETY: signalling processes this test started.
        let stopped: Vec<i32> = old
            .iter()
            .copied()
            .filter(|p| unsafe { libc::kill(*p, libc::SIGSTOP) } == 0)
            .collect();
        fx.forget_mount();
        if stopped.is_empty() {
            continue; // the old daemon was already gone: try again
        }
        conclusive += 1;
        fx.mount();
        for pid in &stopped {
            // SAFETY: as above.
            unsafe { libc::kill(*pid, libc::SIGCONT) };
            assert!(wait_exit(*pid, 10_000), "old daemon {pid} did not exit");
        }
        assert!(
            is_mounted(&fx.mnt),
            "the old daemon's exit unmounted the new mount at {}",
            fx.mnt.display()
        );
        assert_eq!(read(&fx.p("f")), "f");
        fx.unmount();
    }
    assert!(
        conclusive > 0,
        "never caught the old daemon before it exited"
    );
}

/// SIGTERM/SIGINT to the daemon end the mount cleanly (as libfuse daemons do), instead of
/// leaving a dead "Transport endpoint is not connected" mount; the upper keeps what was written.
#[test]
fn signals_to_the_daemon_unmount() {
    require_root!();
    only_layercache!("layercache's daemon");
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let mut fx = unmounted_fixture();
        fx.mount();
        write(&fx.p("kept"), "data");
        let pids = daemon_pids(&fx.mnt);
        assert_eq!(pids.len(), 1, "one daemon for {}", fx.mnt.display());
        // SAFETY: signalling the daemon this test started.
        assert_eq!(unsafe { libc::kill(pids[0], sig) }, 0);
        assert!(
            wait_exit(pids[0], 10_000),
            "daemon did not exit on signal {sig}"
        );
        assert!(!is_mounted(&fx.mnt), "still mounted after signal {sig}");
        fx.forget_mount();
        assert_eq!(read(&fx.upper.join("kept")), "data");
    }
}

#[test]
fn daemon_keeps_no_inherited_descriptor_and_is_named_layercache() {
    require_root!();
    only_layercache!("layercache's daemon");
    use std::os::fd::AsRawFd;
    let mut fx = Fixture::builder()
        .unmounted()
        .build(|l| write(&l[0].join("f"), "x"));
    // A shell's `( flock 9; layercache overlay … ) 9>lock`: the mount command starts with an
    // inheritable, locked fd 9 (opened in the child only, so no other test inherits it).
    let lock_path = fx.upper.parent().unwrap().join("lock");
    fs::write(&lock_path, "").unwrap();
    let c_lock = cstr(&lock_path);
    // SAFETY: open/dup2/flock are async-signal-safe; c_lock was built before the fork.
    fx.mount_with(|cmd| unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || {
            let fd = libc::open(c_lock.as_ptr(), libc::O_RDWR);
            if fd < 0 || libc::dup2(fd, 9) < 0 || libc::flock(9, libc::LOCK_EX) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    });
    // The mount command has exited; only a daemon that kept fd 9 could still hold the lock.
    let again = fs::File::open(&lock_path).unwrap();
    // SAFETY: flock on a descriptor we own.
    let rc = unsafe { libc::flock(again.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(
        rc, 0,
        "the daemon still holds the caller's locked descriptor"
    );
    let pids = daemon_pids(&fx.mnt);
    assert_eq!(pids.len(), 1);
    let comm = fs::read_to_string(format!("/proc/{}/comm", pids[0])).unwrap();
    assert_eq!(
        comm.trim(),
        "layercache",
        "ps/pgrep/pidof name of the daemon"
    );
}

#[test]
fn short_of_descriptors_the_mount_works_or_fails_cleanly() {
    require_root!();
    only_layercache!("layercache's daemon setup");
    use std::os::unix::process::CommandExt;
    // Between "cannot even start the daemon" and "plenty", every limit must give either a
    // mount that serves requests or an error with nothing left mounted (never a hung or dead
    // mount: with FUSE over io_uring the kernel holds requests until all rings are set up).
    for limit in [12u64, 14, 16, 18, 20, 22, 24, 32] {
        let mut fx = Fixture::builder()
            .unmounted()
            .build(|l| write(&l[0].join("f"), "lower\n"));
        let mut cmd = fx.mount_command();
        // SAFETY: setrlimit is async-signal-safe.
        unsafe {
            cmd.pre_exec(move || {
                let r = libc::rlimit {
                    rlim_cur: limit,
                    rlim_max: limit,
                };
                libc::setrlimit(libc::RLIMIT_NOFILE, &r);
                Ok(())
            });
        }
        let out = cmd.output().unwrap();
        if out.status.success() {
            fx.adopt_mount();
            let p = fx.p("f");
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let _ = tx.send(fs::read_to_string(&p).map_err(|e| e.to_string()));
            });
            let got = rx.recv_timeout(std::time::Duration::from_secs(10));
            assert_eq!(
                got,
                Ok(Ok("lower\n".to_string())),
                "RLIMIT_NOFILE {limit}: mounted but not serving"
            );
        } else {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                err.contains("Too many open files"),
                "RLIMIT_NOFILE {limit}: {err}"
            );
            assert_eq!(
                mounts_at(&fx.mnt),
                0,
                "RLIMIT_NOFILE {limit}: failed but left a mount"
            );
        }
    }
}

/// `LAYERCACHE_DAEMON_LOG` (docs/commands.md: often `/tmp/lc.log`) is never followed through a symlink:
/// another user's `/tmp/lc.log -> /etc/…` would make a root daemon append to that file. A
/// plain path gets the log, created 0600; a symlink gets no log and its target is untouched.
#[test]
fn daemon_log_is_private_and_never_a_planted_symlink() {
    require_root!();
    only_layercache!("layercache's own daemon");
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    fs::write(&victim, "keep\n").unwrap();
    let planted = dir.path().join("planted.log");
    std::os::unix::fs::symlink(&victim, &planted).unwrap();
    let plain = dir.path().join("plain.log");
    for log in [&plain, &planted] {
        let mut fx = unmounted_fixture();
        let log = log.to_str().unwrap();
        let envs = [("LAYERCACHE_LOG", "debug"), ("LAYERCACHE_DAEMON_LOG", log)];
        overlay_serving(&mut fx, &[], &envs);
    }
    let meta = fs::metadata(&plain).unwrap();
    assert!(meta.len() > 0, "the daemon logs to a plain path");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(fs::read_to_string(&victim).unwrap(), "keep\n");
    assert!(
        fs::symlink_metadata(&planted)
            .unwrap()
            .file_type()
            .is_symlink()
    );
}

/// A daemon log that cannot be written (`LAYERCACHE_DAEMON_LOG=/dev/full`: every write fails
/// with ENOSPC) loses its lines, never a request. A log line that failed used to panic the
/// request's handler (the log writer reported it with `eprintln!`, which panics when stderr
/// cannot be written) and the request was never answered: its caller waited for ever, as a
/// test of the whole suite once did when the disk filled.
#[test]
fn a_daemon_log_that_cannot_be_written_loses_lines_not_requests() {
    require_root!();
    only_layercache!("layercache's own daemon");
    let mut fx = unmounted_fixture();
    let out = Command::new(BIN)
        .arg("overlay")
        .args(["-o", &fx.options()])
        .arg(&fx.mnt)
        .envs([
            ("LAYERCACHE_LOG", "debug"),
            ("LAYERCACHE_DAEMON_LOG", "/dev/full"),
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    let mnt = fx.mnt.display().to_string();
    // Every access runs in a child killed after 60 s, so a request left unanswered fails
    // this test instead of hanging it; the daemon is then killed, which aborts the
    // connection and frees every waiter.
    let accesses: [&[&str]; 4] = [
        &["stat", &mnt],
        &["cat", &format!("{mnt}/f")],
        &["ls", &format!("{mnt}/inside")],
        &["sh", "-c", &format!("echo new > {mnt}/new")],
    ];
    for args in accesses {
        let out = Command::new("timeout")
            .args(["-s", "KILL", "60"])
            .args(args)
            .output()
            .unwrap();
        if !out.status.success() {
            kill_daemon_of(&fx.mnt);
            lazy_umount(&fx.mnt);
            panic!(
                "{args:?} over a mount whose daemon cannot log: {:?} {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    fx.adopt_mount();
    assert_eq!(read(&fx.p("f")), "f");
    fx.unmount();
    assert_eq!(read(&fx.upper.join("new")), "new\n");
}

/// SIGKILLs the daemon serving `mnt` (found by its command line), which aborts the FUSE
/// connection: every request waiting on it fails with ENOTCONN.
fn kill_daemon_of(mnt: &Path) {
    let want = mnt.as_os_str().as_encoded_bytes();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmd) = fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmd.split(|&b| b == 0).collect();
        if args.contains(&&b"overlay-daemon"[..]) && args.contains(&want) {
            let _ = Command::new("kill")
                .args(["-9", &e.file_name().to_string_lossy()])
                .status();
        }
    }
}
