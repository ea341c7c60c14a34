//! `layercache overlay` as an unprivileged user (issue 22): the mount goes through
//! fusermount3, the overlay semantics a user can exercise hold (copy-up of data, mode and
//! times with the lower unchanged, whiteouts in either form, opaque directories, renames of
//! lower directories, hard links, `user.` xattrs), `fusermount3 -u` and `layercache umount`
//! unmount, root of a user namespace mounts with mount(2), and what a user's mount lacks is
//! refused in one line with exit status 2 before anything is mounted.
//!
//! CI runs as root: each test creates (once) the user `lc-test-rootless` and drops to it with
//! setpriv for every command that touches the mount. Each test runs in a private mount
//! namespace of its own thread ([`Env`]), where /dev/fuse is a device node of the mode the
//! test wants (udev gives 0666; this machine's container leaves 0600) and /etc/fuse.conf says
//! what the test wants — nothing of the host changes, and no mount can reach the host. Every
//! mount sits in a [`UserMount`] guard that unmounts it (fusermount3 -u -z as the user, then
//! umount -l as root) even when the test panics.

#[macro_use]
mod common;

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;

use common::{BIN, daemon_pids, get_xattr, skip_or_fail, tree_fingerprint, wait_exit, write};

/// The unprivileged user the tests run as (created when missing).
const USER: &str = "lc-test-rootless";
/// `PATH` for the user's commands (root's may hold directories the user cannot enter).
const USER_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

static USERADD: Mutex<()> = Mutex::new(());

/// `(uid, gid)` of [`USER`], made with useradd when missing.
fn test_user() -> (u32, u32) {
    let _g = USERADD.lock().unwrap_or_else(|p| p.into_inner());
    let id = |flag: &str| -> Option<u32> {
        let o = Command::new("id").arg(flag).arg(USER).output().ok()?;
        String::from_utf8_lossy(&o.stdout).trim().parse().ok()
    };
    if id("-u").is_none() {
        let o = Command::new("useradd")
            .args(["--system", "--user-group", "--no-create-home"])
            .args(["--shell", "/usr/sbin/nologin", USER])
            .output()
            .expect("useradd");
        assert!(
            o.status.success() || id("-u").is_some(),
            "useradd {USER}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    (id("-u").expect("uid"), id("-g").expect("gid"))
}

/// What an [`Env`] makes of /dev/fuse, /etc/fuse.conf and fusermount3.
#[derive(Clone, Copy)]
struct Machine {
    /// Mode of the /dev/fuse node (udev's default is 0666).
    dev_fuse: u32,
    /// /etc/fuse.conf has `user_allow_other`.
    user_allow_other: bool,
    /// fusermount3 is hidden (a character device bound over it).
    no_fusermount: bool,
}

impl Default for Machine {
    fn default() -> Self {
        Machine {
            dev_fuse: 0o666,
            user_allow_other: false,
            no_fusermount: false,
        }
    }
}

/// A private mount namespace for this test thread, set up as `Machine` says, and a temp dir
/// (0755, root's) holding directories the test user owns.
struct Env {
    uid: u32,
    gid: u32,
    root: PathBuf,
    /// Mounts made in this namespace, undone (detached) in reverse order on drop.
    binds: Vec<PathBuf>,
    _tmp: tempfile::TempDir,
}

fn c(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// mount(2) or panic naming the target.
fn mount(src: &Path, dst: &Path, fstype: Option<&str>, flags: libc::c_ulong) {
    let t = fstype.map(|t| CString::new(t).unwrap());
    // SAFETY: valid C strings (or null) for mount(2).
    let r = unsafe {
        libc::mount(
            c(src).as_ptr(),
            c(dst).as_ptr(),
            t.as_ref().map_or(std::ptr::null(), |t| t.as_ptr()),
            flags,
            std::ptr::null(),
        )
    };
    assert_eq!(
        r,
        0,
        "mount {} on {}: {}",
        src.display(),
        dst.display(),
        std::io::Error::last_os_error()
    );
}

fn helper() -> Option<PathBuf> {
    ["/usr/bin/fusermount3", "/bin/fusermount3"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

impl Env {
    /// Root, /dev/fuse and fusermount3 are needed (else [`skip_or_fail`] and `None`).
    fn new(m: Machine) -> Option<Env> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            skip_or_fail("the rootless tests start as root (they create their user)");
            return None;
        }
        if !Path::new("/dev/fuse").exists() || !Path::new("/etc/fuse.conf").exists() {
            skip_or_fail("needs /dev/fuse and /etc/fuse.conf (Debian's fuse3)");
            return None;
        }
        let Some(fusermount) = helper() else {
            skip_or_fail("needs fusermount3 (Debian's fuse3)");
            return None;
        };
        let (uid, gid) = test_user();
        // SAFETY: unshare of this thread's mount namespace (and fs struct) only.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNS) }, 0, "unshare -m");
        mount(
            Path::new("none"),
            Path::new("/"),
            None,
            libc::MS_REC | libc::MS_PRIVATE,
        );
        let tmp = tempfile::Builder::new()
            .prefix("lc-rootless-")
            .tempdir()
            .unwrap();
        let root = tmp.path().to_path_buf();
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap();
        let mut env = Env {
            uid,
            gid,
            root: root.clone(),
            binds: Vec::new(),
            _tmp: tmp,
        };
        // A device node needs a filesystem without nodev: a tmpfs of this namespace.
        let devdir = root.join("dev");
        fs::create_dir(&devdir).unwrap();
        mount(Path::new("tmpfs"), &devdir, Some("tmpfs"), 0);
        env.binds.push(devdir.clone());
        let node = devdir.join("fuse");
        // SAFETY: valid C string; 10:229 is /dev/fuse (devices.txt).
        let r = unsafe {
            libc::mknod(
                c(&node).as_ptr(),
                libc::S_IFCHR | 0o600,
                libc::makedev(10, 229),
            )
        };
        assert_eq!(r, 0, "mknod {}", node.display());
        fs::set_permissions(&node, fs::Permissions::from_mode(m.dev_fuse)).unwrap();
        mount(&node, Path::new("/dev/fuse"), None, libc::MS_BIND);
        env.binds.push("/dev/fuse".into());
        let conf = devdir.join("fuse.conf");
        let line = if m.user_allow_other {
            "user_allow_other\n"
        } else {
            "#user_allow_other\n"
        };
        fs::write(&conf, line).unwrap();
        mount(&conf, Path::new("/etc/fuse.conf"), None, libc::MS_BIND);
        env.binds.push("/etc/fuse.conf".into());
        if m.no_fusermount {
            mount(Path::new("/dev/null"), &fusermount, None, libc::MS_BIND);
            env.binds.push(fusermount);
        }
        Some(env)
    }

    /// Makes `rel` (a directory below the temp dir, with parents) owned by the test user.
    fn user_dir(&self, rel: &str) -> PathBuf {
        let p = self.root.join(rel);
        fs::create_dir_all(&p).unwrap();
        self.give(&p);
        p
    }

    /// Gives `p` and everything below it to the test user.
    fn give(&self, p: &Path) {
        let o = Command::new("chown")
            .arg("-R")
            .arg(format!("{}:{}", self.uid, self.gid))
            .arg(p)
            .output()
            .unwrap();
        assert!(o.status.success());
    }

    /// `sh -c script` as the test user (no groups, no capabilities) in the temp dir, with
    /// `$LC` the layercache binary; `envs` are extra variables.
    fn as_user_env(&self, script: &str, envs: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new("setpriv");
        cmd.arg(format!("--reuid={}", self.uid))
            .arg(format!("--regid={}", self.gid))
            .args([
                "--clear-groups",
                "--inh-caps=-all",
                "--",
                "/bin/sh",
                "-c",
                script,
            ])
            .current_dir(&self.root)
            .env("PATH", USER_PATH)
            .env("HOME", &self.root)
            .env("LC", BIN)
            .env_remove("LAYERCACHE_WHITEOUT");
        for (k, v) in envs {
            cmd.env(k, v);
        }
        cmd.output().expect("setpriv")
    }

    fn as_user(&self, script: &str) -> Output {
        self.as_user_env(script, &[])
    }

    /// [`Env::as_user`] that must succeed; returns stdout.
    #[track_caller]
    fn user_ok(&self, script: &str) -> String {
        let o = self.as_user(script);
        assert!(
            o.status.success(),
            "as {USER}: {script}\n--stdout--\n{}\n--stderr--\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        for p in self.binds.iter().rev() {
            // SAFETY: valid C string.
            unsafe { libc::umount2(c(p).as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// The FUSE mount at `mnt` in this thread's namespace: `(fs type, options)` from
/// /proc/thread-self/mountinfo (/proc/self shows the main thread's namespace).
fn fuse_mount(mnt: &Path) -> Option<(String, String)> {
    let info = fs::read_to_string("/proc/thread-self/mountinfo").unwrap();
    let want = mnt.to_string_lossy().replace(' ', "\\040");
    info.lines().rev().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        let f: Vec<&str> = pre.split(' ').collect();
        let p: Vec<&str> = post.split(' ').collect();
        (f.get(4) == Some(&want.as_str()) && p[0].starts_with("fuse"))
            .then(|| (p[0].to_string(), p.get(2).unwrap_or(&"").to_string()))
    })
}

/// A user's mount at `mnt`; Drop unmounts it: `fusermount3 -u -z` as the user, then
/// `umount -l` as root (in the test's own namespace).
struct UserMount<'a> {
    env: &'a Env,
    mnt: PathBuf,
}

impl Drop for UserMount<'_> {
    fn drop(&mut self) {
        if fuse_mount(&self.mnt).is_some() {
            let _ = self
                .env
                .as_user(&format!("fusermount3 -u -z {}", shq(&self.mnt)));
        }
        if fuse_mount(&self.mnt).is_some() {
            // SAFETY: valid C string.
            unsafe { libc::umount2(c(&self.mnt).as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// `p` single-quoted for sh.
fn shq(p: &Path) -> String {
    format!("'{}'", p.to_string_lossy().replace('\'', "'\\''"))
}

/// lower/upper/work/mnt below `env`'s temp dir, owned by the test user; `populate` fills the
/// lower (as root, then it is given to the user).
struct Dirs {
    lower: PathBuf,
    upper: PathBuf,
    work: PathBuf,
    mnt: PathBuf,
}

fn dirs(env: &Env, name: &str, populate: impl FnOnce(&Path)) -> Dirs {
    let lower = env.root.join(name).join("lower");
    fs::create_dir_all(&lower).unwrap();
    populate(&lower);
    env.give(&lower);
    Dirs {
        lower,
        upper: env.user_dir(&format!("{name}/upper")),
        work: env.user_dir(&format!("{name}/work")),
        mnt: env.user_dir(&format!("{name}/mnt")),
    }
}

impl Dirs {
    fn opts(&self) -> String {
        format!(
            "lowerdir={},upperdir={},workdir={}",
            self.lower.display(),
            self.upper.display(),
            self.work.display()
        )
    }

    /// `$LC overlay -o OPTS[,extra] MNT` as the user; must succeed; the mount is guarded.
    #[track_caller]
    fn mount<'a>(&self, env: &'a Env, extra: &str, envs: &[(&str, &str)]) -> UserMount<'a> {
        let o = env.as_user_env(
            &format!(
                "\"$LC\" overlay -o '{}{extra}' {}",
                self.opts(),
                shq(&self.mnt)
            ),
            envs,
        );
        let guard = UserMount {
            env,
            mnt: self.mnt.clone(),
        };
        assert!(
            o.status.success(),
            "layercache overlay as {USER}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        guard
    }
}

#[test]
fn a_user_mounts_through_fusermount3_and_copy_up_keeps_data_mode_and_times() {
    let Some(env) = Env::new(Machine::default()) else {
        return;
    };
    let d = dirs(&env, "a", |l| {
        write(&l.join("dir/f"), "lower\n");
        write(&l.join("dir/exe"), "#!/bin/sh\n");
        fs::set_permissions(l.join("dir/exe"), fs::Permissions::from_mode(0o750)).unwrap();
        common::set_times(
            &l.join("dir/exe"),
            (1_600_000_000, 123_456_789),
            (1_500_000_000, 987_654_321),
        );
    });
    let before = tree_fingerprint(&d.lower);
    let m = d.mount(&env, "", &[]);
    let (fstype, opts) = fuse_mount(&d.mnt).expect("mounted");
    assert_eq!(fstype, "fuse.layercache");
    assert!(opts.contains(&format!("user_id={}", env.uid)), "{opts}");
    // Reads come from the lower; a write copies up; setting an xattr copies up metadata-only
    // changes and keeps the data, mode and ns times.
    let out = env.user_ok(&format!(
        "cd {} && cat dir/f && echo more >> dir/f && cat dir/f && \
         /usr/bin/python3 -c 'import os; os.setxattr(\"dir/exe\", \"user.k\", b\"v\")' && \
         stat -c '%a %X.%x %Y' dir/exe",
        shq(&d.mnt)
    ));
    assert!(out.starts_with("lower\nlower\nmore\n"), "{out}");
    assert_eq!(
        fs::read_to_string(d.upper.join("dir/f")).unwrap(),
        "lower\nmore\n"
    );
    let exe = fs::symlink_metadata(d.upper.join("dir/exe")).unwrap();
    assert_eq!(exe.mode() & 0o7777, 0o750);
    assert_eq!(
        (exe.mtime(), exe.mtime_nsec()),
        (1_500_000_000, 987_654_321)
    );
    assert_eq!(
        (exe.atime(), exe.atime_nsec()),
        (1_600_000_000, 123_456_789)
    );
    assert_eq!(
        fs::read_to_string(d.upper.join("dir/exe")).unwrap(),
        "#!/bin/sh\n"
    );
    assert_eq!(
        get_xattr(&d.upper.join("dir/exe"), "user.k").as_deref(),
        Some(&b"v"[..])
    );
    assert_eq!(
        tree_fingerprint(&d.lower),
        before,
        "the lower is never changed"
    );
    // New entries are the user's.
    env.user_ok(&format!(
        "cd {} && echo new > dir/new && mkdir dir/sub",
        shq(&d.mnt)
    ));
    let new = fs::symlink_metadata(d.upper.join("dir/new")).unwrap();
    assert_eq!((new.uid(), new.gid()), (env.uid, env.gid));
    // The daemon runs as the user; fusermount3 -u ends the mount and the daemon.
    let pids = daemon_pids(&d.mnt);
    assert_eq!(pids.len(), 1, "one daemon: {pids:?}");
    let owner = fs::metadata(format!("/proc/{}", pids[0])).unwrap().uid();
    assert_eq!(owner, env.uid);
    env.user_ok(&format!("fusermount3 -u {}", shq(&d.mnt)));
    assert!(fuse_mount(&d.mnt).is_none());
    assert!(
        wait_exit(pids[0], 10_000),
        "the daemon exits after fusermount3 -u"
    );
    drop(m);
}

/// Deleting lower entries leaves whiteouts in the user's upper — 0/0 devices where mknod
/// allows them (it does for a user on Linux ≥ 5.8), `.wh.` files with
/// `LAYERCACHE_WHITEOUT=file` (fuse-overlayfs's fallback) — a re-created directory is opaque,
/// and a new mount of the same upper shows the same tree.
#[test]
fn whiteouts_in_either_form_and_opaque_dirs_persist_across_mounts() {
    let Some(env) = Env::new(Machine::default()) else {
        return;
    };
    for (name, form) in [("dev", None), ("file", Some("file"))] {
        let d = dirs(&env, name, |l| {
            write(&l.join("gone"), "x");
            write(&l.join("keep"), "k");
            write(&l.join("d/inside"), "i");
            write(&l.join("d/more"), "m");
        });
        let envs: Vec<(&str, &str)> = form.iter().map(|f| ("LAYERCACHE_WHITEOUT", *f)).collect();
        let check = |m: &Path| env.user_ok(&format!("cd {} && ls -A . d && cat d/new", shq(m)));
        {
            let _m = d.mount(&env, "", &envs);
            env.user_ok(&format!(
                "cd {} && rm gone && rm -r d && mkdir d && echo n > d/new",
                shq(&d.mnt)
            ));
            assert_eq!(check(&d.mnt), ".:\nd\nkeep\n\nd:\nnew\nn\n", "{name}");
            // Creating a name in the whiteout encoding is refused.
            let o = env.as_user(&format!("cd {} && touch .wh.keep", shq(&d.mnt)));
            assert!(!o.status.success(), "{name}: .wh. names cannot be created");
        }
        let gone = d.upper.join("gone");
        match form {
            None => {
                let m = fs::symlink_metadata(&gone).unwrap();
                assert!(m.file_type().is_char_device() && m.rdev() == 0, "c 0,0");
                assert_eq!(m.uid(), env.uid);
            }
            Some(_) => {
                assert!(fs::symlink_metadata(&gone).is_err());
                assert!(
                    fs::symlink_metadata(d.upper.join(".wh.gone"))
                        .unwrap()
                        .is_file()
                );
                assert!(
                    fs::symlink_metadata(d.upper.join(".wh.d")).is_err(),
                    "re-created"
                );
            }
        }
        assert_eq!(
            get_xattr(&d.upper.join("d"), "user.overlay.opaque").as_deref(),
            Some(&b"y"[..]),
            "{name}: the re-created directory is opaque (user xattr: no trusted.* for a user)"
        );
        let _m = d.mount(&env, "", &[]);
        assert_eq!(
            check(&d.mnt),
            ".:\nd\nkeep\n\nd:\nnew\nn\n",
            "{name} remounted"
        );
    }
}

#[test]
fn a_user_renames_lower_dirs_links_files_and_sets_user_xattrs() {
    let Some(env) = Env::new(Machine::default()) else {
        return;
    };
    let d = dirs(&env, "r", |l| {
        write(&l.join("pkg/a/b/c"), "deep\n");
        write(&l.join("pkg/top"), "t");
        write(&l.join("file"), "f");
    });
    let before = tree_fingerprint(&d.lower);
    let _m = d.mount(&env, "", &[]);
    let out = env.user_ok(&format!(
        "cd {} && mv pkg pkg2 && cat pkg2/a/b/c && ls -A && \
         ln file file2 && stat -c '%i %h' file file2 && \
         /usr/bin/python3 -c 'import os; os.setxattr(\"file\", \"user.mime\", b\"text\"); \
         print(os.getxattr(\"file2\", \"user.mime\").decode()); \
         print(sorted(os.listxattr(\"file\")))'",
        shq(&d.mnt)
    ));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "deep");
    assert_eq!(lines[1..3], ["file", "pkg2"], "{out}");
    let (i1, i2) = (lines[3], lines[4]);
    assert_eq!(i1, i2, "one inode, two links: {out}");
    assert!(i1.ends_with(" 2"), "{out}");
    assert_eq!(lines[5], "text");
    assert_eq!(
        lines[6], "['user.mime']",
        "overlay-private xattrs stay hidden"
    );
    assert_eq!(
        fs::read_to_string(d.upper.join("pkg2/a/b/c")).unwrap(),
        "deep\n"
    );
    assert_eq!(
        fs::metadata(d.upper.join("file")).unwrap().ino(),
        fs::metadata(d.upper.join("file2")).unwrap().ino()
    );
    assert_eq!(tree_fingerprint(&d.lower), before);
}

/// Lowers written by fuse-overlayfs (or a kernel overlayfs upper) are read in either form: a
/// `.wh.` file or a 0/0 device hides the name below, `.wh..wh..opq` or
/// `user.fuseoverlayfs.opaque` makes a directory opaque, and the markers never show.
#[test]
fn lowers_in_either_whiteout_form_are_read() {
    let Some(env) = Env::new(Machine::default()) else {
        return;
    };
    let top = env.root.join("two/top");
    let bottom = env.root.join("two/bottom");
    for rel in ["a", "b", "c", "keep", "o/x", "p/y"] {
        write(&bottom.join(rel), rel);
    }
    write(&top.join(".wh.a"), "");
    fs::create_dir_all(top.join("o")).unwrap();
    write(&top.join("o/.wh..wh..opq"), "");
    write(&top.join("o/mine"), "m");
    fs::create_dir_all(top.join("p")).unwrap();
    common::set_xattr(&top.join("p"), "user.fuseoverlayfs.opaque", b"y").unwrap();
    // SAFETY: valid C string; root makes the 0/0 device as kernel overlayfs would.
    assert_eq!(
        unsafe { libc::mknod(c(&top.join("b")).as_ptr(), libc::S_IFCHR, 0) },
        0
    );
    env.give(&env.root.join("two"));
    let d = Dirs {
        lower: PathBuf::from(format!("{}:{}", top.display(), bottom.display())),
        upper: env.user_dir("two/upper"),
        work: env.user_dir("two/work"),
        mnt: env.user_dir("two/mnt"),
    };
    let _m = d.mount(&env, "", &[]);
    let out = env.user_ok(&format!("cd {} && ls -A . o p && cat c", shq(&d.mnt)));
    assert_eq!(out, ".:\nc\nkeep\no\np\n\no:\nmine\n\np:\nc");
    let o = env.as_user(&format!("stat {}/.wh.a", shq(&d.mnt)));
    assert!(!o.status.success(), "a marker never shows");
}

/// Every refusal comes before anything is mounted, in one line, with exit status 2.
#[test]
fn what_a_user_mount_lacks_is_refused_in_one_line_with_exit_2() {
    let cases: [(&str, Machine, &str, &str); 8] = [
        ("dev", Machine::default(), ",dev", "always nodev,nosuid"),
        ("suid", Machine::default(), ",suid", "always nodev,nosuid"),
        (
            "no-helper",
            Machine {
                no_fusermount: true,
                ..Default::default()
            },
            "",
            "fuse3",
        ),
        (
            "dev-fuse",
            Machine {
                dev_fuse: 0o600,
                ..Default::default()
            },
            "",
            "/dev/fuse",
        ),
        (
            "passthrough",
            Machine::default(),
            ",passthrough",
            "passthrough",
        ),
        (
            "allow-other",
            Machine::default(),
            ",allow_other",
            "/etc/fuse.conf",
        ),
        ("not-owned", Machine::default(), "", "belongs to uid 0"),
        // Root of a user namespace opens /dev/fuse itself: a 0600 node is refused there too.
        (
            "userns-dev-fuse",
            Machine {
                dev_fuse: 0o600,
                ..Default::default()
            },
            "",
            "/dev/fuse is not readable and writable",
        ),
    ];
    for (name, machine, extra, says) in cases {
        let Some(env) = Env::new(machine) else {
            return;
        };
        let d = dirs(&env, name, |l| write(&l.join("f"), "x"));
        if name == "not-owned" {
            fs::create_dir(env.root.join("rootsmnt")).unwrap();
        }
        let mnt = if name == "not-owned" {
            env.root.join("rootsmnt")
        } else {
            d.mnt.clone()
        };
        let _guard = UserMount {
            env: &env,
            mnt: mnt.clone(),
        };
        let wrap = if name.starts_with("userns") {
            "unshare -Urm "
        } else {
            ""
        };
        let o = env.as_user(&format!(
            "{wrap}\"$LC\" overlay -o '{}{extra}' {}",
            d.opts(),
            shq(&mnt)
        ));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{name}: {err}");
        assert_eq!(err.lines().count(), 1, "{name}: one line: {err}");
        assert!(err.contains(says), "{name}: {err}");
        assert!(fuse_mount(&mnt).is_none(), "{name}: nothing is mounted");
        assert!(daemon_pids(&mnt).is_empty(), "{name}: no daemon is left");
    }
}

/// `allow_other` works for a user where /etc/fuse.conf has `user_allow_other`: then another
/// uid (here root) can read the mount, which it cannot without the option.
#[test]
fn allow_other_admits_other_users_only_with_user_allow_other() {
    let Some(env) = Env::new(Machine {
        user_allow_other: true,
        ..Default::default()
    }) else {
        return;
    };
    let d = dirs(&env, "ao", |l| write(&l.join("f"), "shared"));
    {
        let _m = d.mount(&env, "", &[]);
        let e = fs::read_to_string(d.mnt.join("f")).unwrap_err();
        assert_eq!(
            e.raw_os_error(),
            Some(libc::EACCES),
            "private to its user by default"
        );
    }
    let _m = d.mount(&env, ",allow_other", &[]);
    assert_eq!(fs::read_to_string(d.mnt.join("f")).unwrap(), "shared");
    let (_, opts) = fuse_mount(&d.mnt).unwrap();
    assert!(opts.contains("allow_other"), "{opts}");
}

/// A user's daemon killed with SIGKILL leaves a dead mount (as fuse-overlayfs's would);
/// `layercache umount` removes it through fusermount3; a daemon sent SIGTERM unmounts itself.
#[test]
fn layercache_umount_removes_a_users_mount_even_a_dead_one() {
    let Some(env) = Env::new(Machine::default()) else {
        return;
    };
    let d = dirs(&env, "k", |l| write(&l.join("f"), "x"));
    let _m = d.mount(&env, "", &[]);
    env.user_ok(&format!("\"$LC\" umount {}", shq(&d.mnt)));
    assert!(
        fuse_mount(&d.mnt).is_none(),
        "layercache umount of a live user mount"
    );
    let _m = d.mount(&env, "", &[]);
    let pids = daemon_pids(&d.mnt);
    assert_eq!(pids.len(), 1);
    // SAFETY: kill of the daemon this test started.
    unsafe { libc::kill(pids[0], libc::SIGKILL) };
    assert!(wait_exit(pids[0], 10_000));
    assert!(
        fuse_mount(&d.mnt).is_some(),
        "a dead mount stays until unmounted"
    );
    env.user_ok(&format!("\"$LC\" umount {}", shq(&d.mnt)));
    assert!(
        fuse_mount(&d.mnt).is_none(),
        "layercache umount of a dead user mount"
    );
    // SIGTERM: the daemon unmounts itself (fusermount3 -u -z, umount2 being refused) and exits.
    let _m = d.mount(&env, "", &[]);
    let pids = daemon_pids(&d.mnt);
    assert_eq!(pids.len(), 1);
    // SAFETY: kill of the daemon this test started.
    unsafe { libc::kill(pids[0], libc::SIGTERM) };
    assert!(wait_exit(pids[0], 10_000), "the daemon exits on SIGTERM");
    assert!(fuse_mount(&d.mnt).is_none(), "and leaves no mount");
}

/// Root of a user namespace (`unshare -Urm` as the user) mounts with mount(2), no helper; the
/// opaque mark falls back to `user.overlay.opaque` (trusted.* needs the initial namespace).
#[test]
fn root_of_a_user_namespace_mounts_directly() {
    let Some(env) = Env::new(Machine {
        no_fusermount: true,
        ..Default::default()
    }) else {
        return;
    };
    let d = dirs(&env, "ns", |l| write(&l.join("d/f"), "x\n"));
    let out = env.user_ok(&format!(
        "unshare -Urm sh -c '\"$LC\" overlay -o {o} {m} && grep -c \" {m} .*fuse.layercache\" /proc/self/mountinfo && \
         cd {m} && cat d/f && rm -r d && mkdir d && cd / && \"$LC\" umount {m} && \
         ! grep -q \" {m} \" /proc/self/mountinfo && echo unmounted'",
        o = d.opts(),
        m = d.mnt.display()
    ));
    assert_eq!(out, "1\nx\nunmounted\n");
    assert_eq!(
        get_xattr(&d.upper.join("d"), "user.overlay.opaque").as_deref(),
        Some(&b"y"[..])
    );
    assert!(fuse_mount(&d.mnt).is_none());
}

/// `mount MNT` by a user, from an fstab line of type `fuse.layercache` with the `user` option
/// (mount(8) → mount.fuse3 → `layercache SOURCE MNT -o …` as that user → fusermount3), and
/// `umount MNT` by the same user. mount.fuse3 finds `layercache` in /usr/local/bin: a tmpfs of
/// this namespace holds a copy there, and /etc/fstab is the test's own, bound over the host's.
#[test]
fn a_user_mounts_and_unmounts_an_fstab_line_of_type_fuse_layercache() {
    let Some(mut env) = Env::new(Machine::default()) else {
        return;
    };
    if !Path::new("/sbin/mount.fuse3").exists() && !Path::new("/usr/sbin/mount.fuse3").exists() {
        skip_or_fail("needs mount.fuse3 (Debian's fuse3)");
        return;
    }
    let d = dirs(&env, "fstab", |l| write(&l.join("f"), "from fstab\n"));
    let bin = Path::new("/usr/local/bin");
    mount(Path::new("tmpfs"), bin, Some("tmpfs"), 0);
    env.binds.push(bin.into());
    fs::copy(BIN, bin.join("layercache")).unwrap();
    let fstab = env.root.join("dev/fstab");
    fs::write(
        &fstab,
        format!(
            "lcfs {} fuse.layercache noauto,user,{} 0 0\n",
            d.mnt.display(),
            d.opts()
        ),
    )
    .unwrap();
    mount(&fstab, Path::new("/etc/fstab"), None, libc::MS_BIND);
    env.binds.push("/etc/fstab".into());
    let _guard = UserMount {
        env: &env,
        mnt: d.mnt.clone(),
    };
    let out = env.user_ok(&format!("mount {m} && cat {m}/f", m = shq(&d.mnt)));
    assert_eq!(out, "from fstab\n");
    let (fstype, opts) = fuse_mount(&d.mnt).expect("mounted");
    assert_eq!(fstype, "fuse.layercache");
    assert!(opts.contains(&format!("user_id={}", env.uid)), "{opts}");
    env.user_ok(&format!("umount {}", shq(&d.mnt)));
    assert!(fuse_mount(&d.mnt).is_none());
}
