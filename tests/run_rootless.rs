//! `layercache run` without root (issue 22 parts 2-4) and the PID namespace of every step
//! (issue 24 item 2).
//!
//! CI runs as root, so each test makes its own unprivileged user (`useradd` when missing, with a
//! home) and runs layercache as that user with no capabilities (`setpriv --reuid --regid
//! --clear-groups`), its store at the default `$XDG_CACHE_HOME/layercache`. Every user run
//! happens inside a private mount namespace of the test (`unshare -m`) where a 0666 copy of the
//! `/dev/fuse` node is bound over `/dev/fuse` (this machine's is 0600, as without udev's rule),
//! so nothing of the host changes; the user's mounts live in the run's own namespaces, and the
//! tests check that nothing of them is left on the host or anywhere else when the run ends or
//! is killed.

#[path = "common/run.rs"]
mod run_common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use run_common::{BIN, can_mount, have_tool, run_ok, show, skip_or_fail, unshared_run};

/// The unprivileged user the tests run as (made when missing).
const USER: &str = "lcrootless";

/// The test user's ids.
#[derive(Clone, Copy)]
struct User {
    uid: u32,
    gid: u32,
}

fn user() -> User {
    let id = |flag: &str| Command::new("id").args([flag, USER]).output();
    if !id("-u").is_ok_and(|o| o.status.success()) {
        // A concurrent test may have made it meanwhile: only its existence matters.
        let _ = Command::new("useradd")
            .args(["-m", "-s", "/bin/sh", USER])
            .output();
    }
    let num = |flag: &str| -> u32 {
        let o = run_ok(Command::new("id").args([flag, USER]));
        String::from_utf8_lossy(&o.stdout).trim().parse().unwrap()
    };
    User {
        uid: num("-u"),
        gid: num("-g"),
    }
}

/// A temp dir owned by the test user (its `home` with `.cache`, workdirs, mount root) plus a
/// root-owned `dev/` holding the `/dev/fuse` node bound for the user. Drop unmounts anything
/// left below it on the host (there should be nothing: the tests assert that too).
struct Home {
    dir: tempfile::TempDir,
    user: User,
}

impl Home {
    fn new() -> Home {
        let user = user();
        let dir = tempfile::Builder::new()
            .prefix("layercache-rootless-")
            .tempdir()
            .unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let h = Home { dir, user };
        for d in ["home/.cache", "cache", "w1", "w2"] {
            std::fs::create_dir_all(h.path(d)).unwrap();
        }
        std::fs::create_dir_all(h.path("dev")).unwrap();
        for (name, mode) in [("fuse", "666"), ("fuse-0600", "600")] {
            run_ok(Command::new("mknod").args([
                "-m",
                mode,
                h.path("dev").join(name).to_str().unwrap(),
                "c",
                "10",
                "229",
            ]));
        }
        std::fs::write(h.path("dev/zero-sysctl"), "0\n").unwrap();
        h.chown("home");
        for d in ["cache", "w1", "w2"] {
            h.chown(d);
        }
        h
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    fn chown(&self, p: &str) {
        run_ok(Command::new("chown").args([
            "-R",
            &format!("{}:{}", self.user.uid, self.user.gid),
            self.path(p).to_str().unwrap(),
        ]));
    }

    /// The user's store (the default, `$XDG_CACHE_HOME/layercache`).
    fn store(&self) -> PathBuf {
        self.path("home/.cache/layercache")
    }

    /// `layercache ARGS…` as the test user, in a private mount namespace of the test where
    /// `/dev/fuse` is `fuse_node` (a node in `dev/`) and the shell lines in `pre` ran first (as
    /// root of the host, inside that namespace).
    fn command_with(&self, fuse_node: &str, pre: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new("unshare");
        let script = format!(
            "mount --bind {dev}/{fuse_node} /dev/fuse && {pre} exec setpriv --reuid={u} \
             --regid={g} --clear-groups --inh-caps=-all -- \"$@\"",
            dev = self.path("dev").display(),
            u = self.user.uid,
            g = self.user.gid,
        );
        cmd.args([
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            &script,
            "sh",
            BIN,
        ])
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", self.path("home"))
        .env("XDG_CACHE_HOME", self.path("home/.cache"))
        .current_dir(self.path("w1"));
        cmd
    }

    fn command(&self, args: &[&str]) -> Command {
        self.command_with("fuse", "", args)
    }

    /// `layercache --json run --spec SPEC --workdir WORK --mount-root cache FLAGS… -- ARGV…` as
    /// the user.
    fn run(&self, spec: &Path, work: &str, flags: &[&str], argv: &[&str]) -> Output {
        let out = self.run_cmd(spec, work, flags, argv).output().unwrap();
        eprintln!("run as {USER} {flags:?}: {}", show(&out));
        out
    }

    fn run_cmd(&self, spec: &Path, work: &str, flags: &[&str], argv: &[&str]) -> Command {
        let (work, root) = (self.path(work), self.path("cache"));
        let mut args = vec![
            "--json",
            "run",
            "--spec",
            spec.to_str().unwrap(),
            "--workdir",
            work.to_str().unwrap(),
            "--mount-root",
            root.to_str().unwrap(),
        ];
        args.extend(flags);
        args.push("--");
        args.extend(argv);
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.command(&args)
    }

    /// `layercache --store root-store run --spec SPEC --workdir w1 --mount-root root-cache --
    /// ARGV…` as root (the test): root's mount root is its own `root-cache` (the user's
    /// `cache` is refused for root: run/hostpath.rs).
    fn root_cmd(&self, spec: &Path, argv: &[&str]) -> Command {
        std::fs::create_dir_all(self.path("root-cache")).unwrap();
        let mut c = Command::new(BIN);
        c.arg("--store")
            .arg(self.path("root-store"))
            .args(["run", "--spec"])
            .arg(spec)
            .arg("--workdir")
            .arg(self.path("w1"))
            .arg("--mount-root")
            .arg(self.path("root-cache"))
            .arg("--")
            .args(argv);
        c
    }

    fn write_spec(&self, text: &str) -> PathBuf {
        let p = self.path("spec.toml");
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        for m in host_fuse_mounts_below(self.dir.path()) {
            let _ = Command::new("umount").arg("-l").arg(&m).status();
        }
    }
}

/// FUSE mounts of the host's mount namespace below `dir`.
fn host_fuse_mounts_below(dir: &Path) -> Vec<String> {
    let text = std::fs::read_to_string("/proc/self/mounts").unwrap();
    text.lines()
        .filter(|l| l.split(' ').nth(2).is_some_and(|t| t.starts_with("fuse")))
        .filter_map(|l| l.split(' ').nth(1))
        .filter(|m| m.starts_with(dir.to_str().unwrap()))
        .map(str::to_string)
        .collect()
}

/// The pids of live (not zombie) processes owned by `uid` whose environment names `home`
/// (every process of one test's runs inherits its `HOME`; other tests run as the same user).
fn processes_of(uid: u32, home: &Path) -> Vec<u32> {
    let mark = format!("HOME={}", home.display()).into_bytes();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(e.path().join("status")) else {
            continue;
        };
        let field = |name: &str| {
            status
                .lines()
                .find(|l| l.starts_with(name))
                .map(|l| l[name.len()..].trim().to_string())
                .unwrap_or_default()
        };
        let zombie = field("State:").starts_with('Z') || field("State:").starts_with('X');
        let real_uid = field("Uid:").split_whitespace().next().map(str::to_string);
        let env = std::fs::read(e.path().join("environ")).unwrap_or_default();
        let ours = env.split(|b| *b == 0).any(|v| v == mark.as_slice());
        if !zombie && real_uid.as_deref() == Some(&uid.to_string()) && ours {
            out.push(pid);
        }
    }
    out
}

/// The processes whose mount namespace is `ns` (`mnt:[…]`).
fn processes_in_mnt_ns(ns: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse::<u32>().ok()?;
            let link = std::fs::read_link(e.path().join("ns/mnt")).ok()?;
            (link.to_str()? == ns).then_some(pid)
        })
        .collect()
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| !matches!(s.rsplit(')').next().map(str::trim_start), Some(t) if t.starts_with('Z') || t.starts_with('X')))
}

/// Polls `f` every 20 ms until it returns true or `limit` passes (a bound on a hang, not a
/// speed claim); returns its last answer.
fn within(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Kills `child` (and reaps it) when a test panics before it ends.
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether these tests can run: root (to make the user), /dev/fuse, unshare and setpriv.
fn ready() -> bool {
    let useradd = Command::new("sh")
        .args(["-c", "command -v useradd"])
        .output()
        .is_ok_and(|o| o.status.success());
    can_mount()
        && have_tool("unshare")
        && have_tool("setpriv")
        && (useradd || !skip_or_fail("needs useradd (Debian's passwd package)"))
}

fn summary(out: &Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.lines().next().unwrap_or("{}")).unwrap_or_default()
}

const SMALL_SPEC: &str = r#"project = "rootless"
[[cache]]
id = "c"
key_files = ["lock"]
setup = "echo filled > \"$LAYERCACHE_MOUNT/f\""
"#;

/// An npm download cache filled from the registry once per test (as root, then given to the
/// user), so the user's `npm ci` runs offline against it.
fn npm_cache(h: &Home) -> PathBuf {
    let scratch = h.path("npm-fill");
    std::fs::create_dir_all(&scratch).unwrap();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/npm-app");
    for f in ["package.json", "package-lock.json"] {
        std::fs::copy(example.join(f), scratch.join(f)).unwrap();
        for w in ["w1", "w2"] {
            std::fs::copy(example.join(f), h.path(w).join(f)).unwrap();
        }
    }
    let cache = h.path("home/npm-cache");
    run_ok(
        Command::new("npm")
            .args(["ci", "--ignore-scripts", "--no-audit", "--no-fund"])
            .current_dir(&scratch)
            .env("npm_config_cache", &cache),
    );
    std::fs::remove_dir_all(&scratch).unwrap();
    h.chown("home");
    h.chown("w1");
    h.chown("w2");
    cache
}

/// README's npm case as an unprivileged user with `sandbox`: a miss runs `npm ci` (offline,
/// from a filled npm cache) and publishes; a second workspace of the same project hits the
/// layer the user filled. Steps run as the user's own uid, what they write is the user's on
/// disk, the layer's entries have the user as canonical owner, and nothing is left mounted.
fn npm_fills_then_hits_as_a_user(sandbox: &str) {
    if !ready() || !have_tool("npm") || (sandbox == "bwrap" && !have_tool("bwrap")) {
        return;
    }
    let h = Home::new();
    let cache = npm_cache(&h);
    let spec = h.write_spec(
        "project = \"rootless-npm\"\n[[cache]]\nid = \"node_modules\"\npreset = \"node_modules\"\n",
    );
    let check = "node -e \"require('react'); require('lodash')\" && id -u && id -g && \
                 touch made-by-command && stat -c %u node_modules/react/package.json";
    let mut cmd = h.run_cmd(&spec, "w1", &["--sandbox", sandbox], &["sh", "-c", check]);
    cmd.env("npm_config_cache", &cache)
        .env("npm_config_offline", "true");
    let first = cmd.output().unwrap();
    eprintln!("first run: {}", show(&first));
    assert!(first.status.success(), "{}", show(&first));
    let s = summary(&first);
    assert_eq!(s["caches"][0]["result"], "miss", "{s}");
    let lines: Vec<String> = String::from_utf8_lossy(&first.stdout)
        .lines()
        .skip(1)
        .map(str::to_string)
        .collect();
    let (u, g) = (h.user.uid.to_string(), h.user.gid.to_string());
    assert_eq!(
        lines,
        [u.clone(), g.clone(), u.clone()],
        "the step's ids and the view's owner"
    );
    let made = std::fs::metadata(h.path("w1/made-by-command")).unwrap();
    assert_eq!((made.uid(), made.gid()), (h.user.uid, h.user.gid));
    // The layer: in the user's default store, its entries the user's (canonical owner).
    let layers = h.store().join("v1/projects/rootless-npm/layers");
    let layer = std::fs::read_dir(&layers).unwrap().next().unwrap().unwrap();
    let react = layer.path().join("tree/react/package.json");
    let meta = std::fs::metadata(&react).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid()),
        (h.user.uid, h.user.gid),
        "{}",
        react.display()
    );
    let dir = std::fs::metadata(layer.path().join("tree/react")).unwrap();
    assert_eq!((dir.uid(), dir.gid()), (h.user.uid, h.user.gid));

    // Another workspace of the project, no npm cache at all: the user's layer is a hit.
    let second = h.run(&spec, "w2", &["--sandbox", sandbox], &["sh", "-c", check]);
    assert!(second.status.success(), "{}", show(&second));
    assert_eq!(summary(&second)["caches"][0]["result"], "hit");
    assert!(host_fuse_mounts_below(h.dir.path()).is_empty());
    assert_eq!(
        processes_of(h.user.uid, &h.path("home")),
        Vec::<u32>::new(),
        "processes left"
    );
}

#[test]
fn npm_fills_then_hits_as_a_user_without_a_sandbox() {
    npm_fills_then_hits_as_a_user("none");
}

#[test]
fn npm_fills_then_hits_as_a_user_in_bwrap() {
    npm_fills_then_hits_as_a_user("bwrap");
}

/// Starts a user run of [`SMALL_SPEC`] whose COMMAND touches `ready` and waits for `go`, and
/// returns it once `ready` is there with the run's mount namespace.
fn started_user_run(h: &Home) -> (Reap, String) {
    if !h.path("w1/lock").exists() {
        std::fs::write(h.path("w1/lock"), "1\n").unwrap();
    }
    h.chown("w1");
    let spec = h.write_spec(SMALL_SPEC);
    let wait = "touch ready; while [ ! -e go ]; do sleep 0.05; done; cat \"$C\" 2>&1; true";
    let mut cmd = h.run_cmd(&spec, "w1", &[], &["sh", "-c", wait]);
    let child = Reap(cmd.stdout(Stdio::null()).spawn().unwrap());
    assert!(
        within(Duration::from_secs(60), || h.path("w1/ready").exists()),
        "the run's COMMAND never started"
    );
    // `unshare … sh -c '… exec setpriv … layercache'`: the spawned pid is layercache's.
    let ns = std::fs::read_link(format!("/proc/{}/ns/mnt", child.0.id()))
        .unwrap()
        .to_string_lossy()
        .into_owned();
    (child, ns)
}

/// The user's run ended: no process of the user, nothing in the run's mount namespace (so no
/// mount of it exists anywhere), nothing mounted on the host below the test dir.
fn assert_nothing_left(h: &Home, ns: &str) {
    let gone = within(Duration::from_secs(10), || {
        processes_of(h.user.uid, &h.path("home")).is_empty() && processes_in_mnt_ns(ns).is_empty()
    });
    assert!(
        gone,
        "left: processes {:?}, in the run's namespace {:?}",
        processes_of(h.user.uid, &h.path("home")),
        processes_in_mnt_ns(ns)
    );
    assert_eq!(host_fuse_mounts_below(h.dir.path()), Vec::<String>::new());
}

#[test]
fn kill_9_of_a_users_run_leaves_no_mount_and_no_process() {
    if !ready() {
        return;
    }
    let h = Home::new();
    let (mut run, ns) = started_user_run(&h);
    let daemons: Vec<u32> = processes_in_mnt_ns(&ns)
        .into_iter()
        .filter(|p| cmdline(*p).contains("overlay-daemon"))
        .collect();
    assert_eq!(
        daemons.len(),
        1,
        "one overlay daemon in the run's namespace"
    );
    // SAFETY: kill(2) of the run we spawned.
    unsafe { libc::kill(run.0.id() as i32, libc::SIGKILL) };
    let _ = run.0.wait();
    assert_nothing_left(&h, &ns);
}

#[test]
fn kill_9_of_a_users_daemon_fails_the_run_and_leaves_nothing() {
    if !ready() {
        return;
    }
    let h = Home::new();
    let (mut run, ns) = started_user_run(&h);
    let daemon = processes_in_mnt_ns(&ns)
        .into_iter()
        .find(|p| cmdline(*p).contains("overlay-daemon"))
        .expect("the run's overlay daemon");
    // SAFETY: kill(2) of the daemon the user's run started.
    unsafe { libc::kill(daemon as i32, libc::SIGKILL) };
    std::fs::write(h.path("w1/go"), "").unwrap();
    let status = run.0.wait().unwrap();
    assert_eq!(status.code(), Some(1), "a run whose mount died fails");
    assert_nothing_left(&h, &ns);
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// Each refusal of an unprivileged run: one line on stderr, exit 2, nothing mounted, no
/// store created.
#[test]
fn refusals_of_a_user_run_are_one_line_exit_2() {
    if !ready() {
        return;
    }
    let h = Home::new();
    std::fs::write(h.path("w1/lock"), "1\n").unwrap();
    h.chown("w1");
    let spec = h.write_spec(SMALL_SPEC);
    let sysctl = h.path("dev/zero-sysctl");
    let zero = format!(
        "mount --bind {} /proc/sys/user/max_user_namespaces &&",
        sysctl.display()
    );
    let cases: [(&str, &str, &str, &[&str], &str); 4] = [
        (
            "another uid",
            "fuse",
            "",
            &["--user", "65534:65534"],
            "run its steps only as itself",
        ),
        (
            "docker",
            "fuse",
            "",
            &["--sandbox", "docker", "--image", "x"],
            "no Docker engine can see",
        ),
        ("no /dev/fuse", "fuse-0600", "", &[], "/dev/fuse"),
        (
            "user namespaces off",
            "fuse",
            &zero,
            &[],
            "user.max_user_namespaces = 0",
        ),
    ];
    for (what, node, pre, flags, says) in cases {
        let (work, root) = (h.path("w1"), h.path("cache"));
        let mut args = vec![
            "run",
            "--spec",
            spec.to_str().unwrap(),
            "--workdir",
            work.to_str().unwrap(),
            "--mount-root",
            root.to_str().unwrap(),
        ];
        args.extend(flags);
        args.extend(["--", "true"]);
        let out = h.command_with(node, pre, &args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{what}: {}", show(&out));
        assert_eq!(err.trim_end().lines().count(), 1, "{what}: one line: {err}");
        assert!(err.contains(says), "{what}: {err}");
        assert!(
            !h.store().join("v1/projects").exists(),
            "{what}: nothing made"
        );
    }
    // A mount root the user cannot create (the default /cache is one: / is root's).
    let root = "/lc-test-no-such-root/cache";
    let work = h.path("w1");
    let args = [
        "run",
        "--spec",
        spec.to_str().unwrap(),
        "--workdir",
        work.to_str().unwrap(),
        "--mount-root",
        root,
        "--",
        "true",
    ];
    let out = h.command_with("fuse", "", &args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "mount root: {}", show(&out));
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "mount root: one line: {err}"
    );
    assert!(
        err.contains("--mount-root /lc-test-no-such-root/cache: does not exist")
            && err.contains("cannot create it (/ is not writable)"),
        "mount root: {err}"
    );
    assert!(!std::path::Path::new("/lc-test-no-such-root").exists());
    assert!(
        !h.store().join("v1/projects").exists(),
        "mount root: nothing made"
    );
    assert!(host_fuse_mounts_below(h.dir.path()).is_empty());
}

/// Issue 24 item 2: `kill -9` of `layercache run` during a setup that started a daemonised
/// grandchild (setsid and a double fork, so neither its process group nor its session is the
/// run's): nothing of it survives, because the setup ran in a PID namespace of its own whose
/// init died with the run. `as_user`: the same for an unprivileged run.
fn setsid_escapee_dies_with_a_killed_run(as_user: bool) {
    if !ready() {
        return;
    }
    let h = Home::new();
    std::fs::write(h.path("w1/lock"), "1\n").unwrap();
    let pidfile = h.path("w1/grandchild.pid");
    // The grandchild writes its pid as the host sees it: /proc/self is the host's /proc here.
    let setup = format!(
        "( setsid sh -c 'read -r p rest < /proc/self/stat; echo $p > {pf}.tmp; mv {pf}.tmp {pf}; \
         exec sleep 120' & ) ; while [ ! -e {pf} ]; do sleep 0.05; done; sleep 120",
        pf = pidfile.display()
    );
    let spec = h.write_spec(&format!(
        "project = \"pidns\"\n[[cache]]\nid = \"c\"\nkey_files = [\"lock\"]\nsetup = {}\n",
        toml_string(&setup)
    ));
    h.chown("w1");
    let mut cmd = if as_user {
        h.run_cmd(&spec, "w1", &[], &["true"])
    } else {
        h.root_cmd(&spec, &["true"])
    };
    let mut run = Reap(cmd.stdout(Stdio::null()).spawn().unwrap());
    assert!(
        within(Duration::from_secs(60), || pidfile.exists()),
        "the setup's grandchild never wrote its pid"
    );
    let pid: u32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(alive(pid), "the grandchild {pid} runs");
    let its_ns = std::fs::read_link(format!("/proc/{pid}/ns/pid")).unwrap();
    // SAFETY: kill(2) of the run we spawned.
    unsafe { libc::kill(run.0.id() as i32, libc::SIGKILL) };
    let _ = run.0.wait();
    std::thread::sleep(Duration::from_secs(2));
    let survived = alive(pid);
    if survived {
        // SAFETY: kill(2) of the escapee this test made, so that a failure leaves nothing.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    assert!(
        !survived,
        "the setsid grandchild {pid} survived the run's kill -9"
    );
    assert_ne!(
        its_ns,
        std::fs::read_link("/proc/self/ns/pid").unwrap(),
        "the setup ran in a PID namespace of its own"
    );
    if as_user {
        assert!(
            within(Duration::from_secs(10), || processes_of(
                h.user.uid,
                &h.path("home")
            )
            .is_empty()),
            "left: {:?}",
            processes_of(h.user.uid, &h.path("home"))
        );
    }
    assert!(host_fuse_mounts_below(h.dir.path()).is_empty());
}

fn toml_string(s: &str) -> String {
    serde_json::to_string(s).unwrap() // a JSON string is a valid TOML basic string here
}

#[test]
fn setsid_escapee_dies_with_a_killed_root_run() {
    setsid_escapee_dies_with_a_killed_run(false);
}

#[test]
fn setsid_escapee_dies_with_a_killed_user_run() {
    setsid_escapee_dies_with_a_killed_run(true);
}

/// The step is PID 2 of its own namespace (under the init), its exit status comes through, and
/// what it left running in the background is gone when it ends — for root and the user.
#[test]
fn steps_run_under_an_init_and_pass_their_status_through() {
    if !ready() {
        return;
    }
    let h = Home::new();
    std::fs::write(h.path("w1/lock"), "1\n").unwrap();
    h.chown("w1");
    let spec = h.write_spec(SMALL_SPEC);
    let argv = ["sh", "-c", "echo pid=$$; exit 7"];
    let user = h.run(&spec, "w1", &[], &argv);
    assert_eq!(user.status.code(), Some(7), "{}", show(&user));
    assert!(String::from_utf8_lossy(&user.stdout).contains("pid=2\n"));
    let root = h.root_cmd(&spec, &argv).output().unwrap();
    assert_eq!(root.status.code(), Some(7), "{}", show(&root));
    assert_eq!(String::from_utf8_lossy(&root.stdout), "pid=2\n");
}

/// Issue 22 part 3: the store commands on a user's own store (the default under
/// `$XDG_CACHE_HOME`), unprivileged: `key`, `ls`, `stats`, `verify`, `gc` (which reaps the run
/// record a `kill -9`'d run left, taking its lease files, in the project's 0700 tree),
/// `remote push`/`pull` (a file:// remote; the pulled layer is the user's), `serve` on
/// loopback, and `clear`.
#[test]
fn store_commands_work_on_a_users_store() {
    if !ready() {
        return;
    }
    let h = Home::new();
    std::fs::write(h.path("w1/lock"), "1\n").unwrap();
    h.chown("w1");
    let spec = h.write_spec(SMALL_SPEC);
    let filled = h.run(&spec, "w1", &[], &["true"]);
    assert!(filled.status.success(), "{}", show(&filled));
    // A second key, killed during its COMMAND: its run record stays for gc.
    std::fs::write(h.path("w1/lock"), "2\n").unwrap();
    let _ = std::fs::remove_file(h.path("w1/ready"));
    let (mut run, ns) = started_user_run(&h);
    // SAFETY: kill(2) of the run we spawned.
    unsafe { libc::kill(run.0.id() as i32, libc::SIGKILL) };
    let _ = run.0.wait();
    assert_nothing_left(&h, &ns);
    let runs = h.store().join("v1/projects/rootless/runs");
    let as_user = |args: &[&str]| {
        let out = h.command(args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", show(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let (w1, root) = (h.path("w1"), h.path("cache"));
    let key = as_user(&[
        "--json",
        "key",
        "--spec",
        spec.to_str().unwrap(),
        "--workdir",
        w1.to_str().unwrap(),
        "--mount-root",
        root.to_str().unwrap(),
    ]);
    assert!(key.contains("rootless") || key.contains("\"c\""), "{key}");
    let layers = |text: String| -> usize {
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v.as_array().unwrap().len()
    };
    assert_eq!(layers(as_user(&["--json", "ls"])), 2, "two layers");
    as_user(&["stats"]);
    as_user(&["verify"]);
    assert!(
        std::fs::read_dir(&runs).unwrap().next().is_some(),
        "the killed run's record"
    );
    as_user(&["gc"]);
    let left: Vec<_> = std::fs::read_dir(&runs)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(
        left,
        Vec::<PathBuf>::new(),
        "gc reaped the killed run's record"
    );
    // The remote tier (a file:// remote of the user's): push a key, clear it here, pull it back.
    let listing: serde_json::Value = serde_json::from_str(&as_user(&["--json", "ls"])).unwrap();
    let key = listing[0]["keys"][0].as_str().unwrap().to_string();
    let remote = format!("file://{}", h.path("home/remote").display());
    let rk = ["--project", "rootless", "--cache", "c", key.as_str()];
    as_user(&[&["--remote", &remote, "remote", "push"][..], &rk].concat());
    as_user(&["clear", "--project", "rootless", "--cache", "c"]);
    assert_eq!(layers(as_user(&["--json", "ls"])), 0);
    as_user(&[&["--remote", &remote, "remote", "pull"][..], &rk].concat());
    let pulled: serde_json::Value = serde_json::from_str(&as_user(&["--json", "ls"])).unwrap();
    assert_eq!(pulled[0]["keys"][0], key.as_str(), "pulled back: {pulled}");
    let tree = h.store().join("v1/projects/rootless/layers");
    let layer = std::fs::read_dir(&tree)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let f = std::fs::metadata(layer.join("tree/f")).unwrap();
    assert_eq!(
        (f.uid(), f.gid()),
        (h.user.uid, h.user.gid),
        "a pulled layer is the user's"
    );
    // serve on loopback, unprivileged: the API lists the project to the store's token (from
    // the login URL it printed).
    let mut serve = Reap(
        h.command(&["--json", "serve", "--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(serve.0.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let url: serde_json::Value = serde_json::from_str(&line).unwrap();
    let addr = url["listen"].as_str().unwrap();
    let addr = addr.trim_start_matches("http://").trim_end_matches('/');
    let token = url["login"]
        .as_str()
        .unwrap()
        .split_once("?token=")
        .unwrap()
        .1;
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    use std::io::{Read, Write};
    write!(
        conn,
        "GET /api/v1/projects HTTP/1.0\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\
         Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    assert!(
        answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200"),
        "{answer}"
    );
    assert!(answer.contains("rootless"), "{answer}");
    // SAFETY: kill(2) of the server we spawned.
    unsafe { libc::kill(serve.0.id() as i32, libc::SIGTERM) };
    let _ = serve.0.wait();
    as_user(&["clear", "--project", "rootless"]);
    assert_eq!(layers(as_user(&["--json", "ls"])), 0);
    let owner = std::fs::metadata(h.store().join("v1")).unwrap().uid();
    assert_eq!(owner, h.user.uid, "the store is the user's");
}

/// SIGINT of `layercache run` (Ctrl-C's signal) still reaches the step through the PID
/// namespace's init, for root and the user: the step's trap runs, and the run ends with
/// 128 + SIGINT.
#[test]
fn sigint_reaches_the_step_through_its_init() {
    if !ready() {
        return;
    }
    let h = Home::new();
    std::fs::write(h.path("w1/lock"), "1\n").unwrap();
    h.chown("w1");
    let spec = h.write_spec(SMALL_SPEC);
    let step = "trap 'echo got-int > got; exit 5' INT; touch ready; while :; do sleep 0.05; done";
    for as_user in [false, true] {
        let _ = std::fs::remove_file(h.path("w1/ready"));
        let _ = std::fs::remove_file(h.path("w1/got"));
        let mut cmd = if as_user {
            h.run_cmd(&spec, "w1", &[], &["sh", "-c", step])
        } else {
            h.root_cmd(&spec, &["sh", "-c", step])
        };
        let mut run = Reap(
            cmd.stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .unwrap(),
        );
        assert!(
            within(Duration::from_secs(60), || h.path("w1/ready").exists()),
            "COMMAND never started (as_user {as_user})"
        );
        // SAFETY: kill(2) of the run we spawned.
        unsafe { libc::kill(run.0.id() as i32, libc::SIGINT) };
        let status = run.0.wait().unwrap();
        assert_eq!(status.code(), Some(130), "as_user {as_user}");
        assert_eq!(
            std::fs::read_to_string(h.path("w1/got")).unwrap_or_default(),
            "got-int\n",
            "the step's trap ran (as_user {as_user})"
        );
    }
}

/// `layercache --store root-store --json run --spec SPEC --workdir WORK --mount-root ROOT --
/// ARGV…` as root, inside a private mount namespace of the test (`unshare -m`: a wrong mount
/// cannot cover a host path).
fn root_run(h: &Home, spec: &Path, work: &Path, root: &Path, argv: &[&str]) -> Output {
    let out = unshared_run(&h.path("root-store"), spec, work, root)
        .arg("--")
        .args(argv)
        .output()
        .unwrap();
    eprintln!("root run --mount-root {}: {}", root.display(), show(&out));
    out
}

/// `(name, what it is)` of every entry of `dir`, sorted: `-> target` for a symlink, `dir`, or
/// a file's content.
fn entries(dir: &Path) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| {
            let p = e.path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let what = if m.file_type().is_symlink() {
                format!("-> {}", std::fs::read_link(&p).unwrap().display())
            } else if m.is_dir() {
                "dir".into()
            } else {
                std::fs::read_to_string(&p).unwrap_or_default()
            };
            (e.file_name().to_string_lossy().into_owned(), what)
        })
        .collect();
    v.sort();
    v
}

/// Issue 29 item 4: README's `mkdir -m 1777 /cache` shared by every user. Another user plants
/// symlinks at root's view paths (`npm -> a directory of theirs`, `deps -> /etc`) and a
/// directory of its own in the mount root: root's run neither refuses (it used to, exit 2) nor
/// follows them — its steps see the mount root as a tmpfs of their own holding only the run's
/// views — and nothing outside (the user's directory, /etc) or of the planted entries changes;
/// the user's own run over the same mount root works too. A mount root another user could
/// replace (in a directory that user owns, or may write without the sticky bit) is refused
/// before anything is made, naming the directory.
#[test]
fn entries_planted_in_a_shared_mount_root_do_not_reach_other_users_runs() {
    if !ready() {
        return;
    }
    let h = Home::new();
    let shared = h.path("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let outside = h.path("w2/outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("keep"), "mine\n").unwrap();
    h.chown("w2");
    // The user plants them with no capabilities.
    let plant = format!(
        "ln -s {out} {s}/npm && ln -s /etc {s}/deps && mkdir {s}/other && echo u > {s}/other/f",
        out = outside.display(),
        s = shared.display()
    );
    run_ok(Command::new("setpriv").args([
        &format!("--reuid={}", h.user.uid),
        &format!("--regid={}", h.user.gid),
        "--clear-groups",
        "--inh-caps=-all",
        "sh",
        "-c",
        &plant,
    ]));
    let planted = entries(&shared);
    let outside_before = entries(&outside);
    let spec = h.write_spec(
        "project = \"shared\"\n\
         [[cache]]\nid = \"npm\"\nkey_files = [\"lock\"]\nsetup = \"echo filled > {mount}/f\"\n\
         [[cache]]\nid = \"deps\"\nkey_files = [\"lock\"]\nsetup = \"echo filled > {mount}/f\"\n",
    );
    let work = h.path("root-work");
    std::fs::create_dir(&work).unwrap();
    std::fs::write(work.join("lock"), "1\n").unwrap();
    let look = format!(
        "cat {s}/npm/f {s}/deps/f && ls -A {s} | tr '\\n' ' '",
        s = shared.display()
    );
    for want in ["miss", "hit"] {
        let o = root_run(&h, &spec, &work, &shared, &["sh", "-c", &look]);
        assert_eq!(o.status.code(), Some(0), "{}", show(&o));
        let sum = summary(&o);
        for c in sum["caches"].as_array().unwrap() {
            assert_eq!(c["result"], want, "{sum}");
        }
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert!(
            stdout.contains("filled\nfilled\ndeps npm "),
            "the steps see only the run's views: {stdout}"
        );
    }
    assert_eq!(
        entries(&shared),
        planted,
        "the planted entries are as they were"
    );
    assert_eq!(entries(&outside), outside_before, "nothing written outside");
    assert!(!Path::new("/etc/f").exists());
    // The user's own run over the same shared mount root.
    std::fs::write(h.path("w1/lock"), "1\n").unwrap();
    h.chown("w1");
    let user_spec = h.path("user-spec.toml");
    std::fs::copy(&spec, &user_spec).unwrap();
    let mut args: Vec<String> = ["--json", "run", "--spec"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.push(user_spec.display().to_string());
    for (flag, p) in [
        ("--workdir", h.path("w1")),
        ("--mount-root", shared.clone()),
    ] {
        args.push(flag.into());
        args.push(p.display().to_string());
    }
    args.extend(["--".into(), "sh".into(), "-c".into(), look.clone()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = h.command(&args).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("filled\nfilled\ndeps npm "));
    assert_eq!(entries(&shared), planted);
    assert_eq!(entries(&outside), outside_before);
    // Mount roots another user could replace: refused, naming why, nothing made.
    let open = h.path("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    for (root, why) in [
        (h.path("cache/r"), format!("is owned by uid {}", h.user.uid)),
        (
            open.join("r"),
            "(mode 777) may be written by other users".into(),
        ),
    ] {
        let o = root_run(&h, &spec, &work, &root, &["true"]);
        assert_eq!(o.status.code(), Some(2), "{}", show(&o));
        let err = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(
            err.contains(&format!("--mount-root {}: refused", root.display()))
                && err.contains(&why),
            "{err}"
        );
        assert!(!root.exists(), "nothing made");
    }
    // A store another user could replace is refused the same way.
    let user_store = h.path("cache/store");
    let o = Command::new(BIN)
        .arg("--store")
        .arg(&user_store)
        .args(["run", "--spec"])
        .arg(&spec)
        .arg("--workdir")
        .arg(&work)
        .arg("--mount-root")
        .arg(&shared)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("--store {}: refused", user_store.display())),
        "{err}"
    );
    assert!(!user_store.exists());
    assert!(host_fuse_mounts_below(h.dir.path()).is_empty());
}
