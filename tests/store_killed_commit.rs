//! A `layercache commit` killed with SIGKILL (issue 25): its remount of the published layer must
//! never leave a second mount stacked at the mountpoint, and `umount`, the next `mount` and `gc`
//! clear whatever a dead commit (or mount) left there — every mount of the store's runs at that
//! path, found in /proc/self/mountinfo.
//!
//! Every mount is held by a [`Mounted`] guard (`layercache umount`, then `umount -l`). Skipped
//! (as a pass) when not root or without /dev/fuse; a failure instead when `CI` is set.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

#[path = "common/mounts.rs"]
mod mounts;

use mounts::{Mounted, can_mount, names, run_ok, write};

/// A temporary store and mountpoint.
struct Env {
    t: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        Env {
            t: tempfile::tempdir().unwrap(),
        }
    }
    fn store(&self) -> PathBuf {
        self.t.path().join("store")
    }
    fn dir(&self, name: &str) -> PathBuf {
        let p = self.t.path().join(name);
        fs::create_dir_all(&p).unwrap();
        p
    }
    /// `layercache --store STORE ARGS…` (LAYERCACHE_STORE unset).
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(mounts::BIN);
        c.arg("--store")
            .arg(self.store())
            .args(args)
            .env_remove("LAYERCACHE_STORE");
        c
    }
    #[track_caller]
    fn ok(&self, args: &[&str]) -> String {
        String::from_utf8(run_ok(&mut self.cmd(args)).stdout).unwrap()
    }
    /// `layercache mount` of `key` at `mnt` → (guard, outcome).
    #[track_caller]
    fn mount(&self, key: &str, mnt: &Path) -> (Mounted, Value) {
        let guard = Mounted {
            store: self.store(),
            mnt: mnt.to_path_buf(),
        };
        let m = mnt.to_str().unwrap();
        let out = self.ok(&["mount", "--project", "p", "--cache", "c", "--key", key, m]);
        let v = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
        (guard, v)
    }
    /// The directory of run `run` (`…/runs/<run>`).
    fn run_dir(&self, run: &str) -> PathBuf {
        let out = self.ok_find(run);
        PathBuf::from(
            out.lines()
                .next()
                .unwrap_or_else(|| panic!("no run dir {run}")),
        )
    }
    fn ok_find(&self, run: &str) -> String {
        let out = run_ok(Command::new("find").arg(self.store()).args([
            "-type",
            "d",
            "-path",
            &format!("*/runs/{run}"),
        ]));
        String::from_utf8(out.stdout).unwrap()
    }
}

/// How many mounts /proc/self/mountinfo lists exactly at `p` (stacked ones each count).
fn mounts_at(p: &Path) -> usize {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let want = p.to_str().unwrap();
    text.lines()
        .filter(|l| l.split(' ').nth(4) == Some(want))
        .count()
}

/// The pid of a process that has exited (and was reaped).
fn dead_pid() -> u32 {
    let mut c = Command::new("true").spawn().unwrap();
    let pid = c.id();
    c.wait().unwrap();
    pid
}

/// Rewrites fields of a run record (`runs/<run>/run.json`).
fn edit_record(run_dir: &Path, edit: impl FnOnce(&mut Value)) {
    let p = run_dir.join("run.json");
    let mut rec: Value = serde_json::from_slice(&fs::read(&p).unwrap()).unwrap();
    edit(&mut rec);
    fs::write(&p, rec.to_string()).unwrap();
}

const FILES: usize = 20;

fn fill(mnt: &Path, round: usize) {
    for i in 0..FILES {
        write(
            &mnt.join(format!("d{}/f{i}", i % 4)),
            format!("{round}-{i}"),
        );
    }
}

/// A hit shows every file the killed commit's fill wrote; a miss shows none.
#[track_caller]
fn assert_complete_or_clean(mnt: &Path, v: &Value, round: usize) {
    match v["result"].as_str() {
        Some("hit") => {
            for i in 0..FILES {
                let p = mnt.join(format!("d{}/f{i}", i % 4));
                assert_eq!(
                    fs::read_to_string(&p).ok().as_deref(),
                    Some(format!("{round}-{i}").as_str()),
                    "round {round}: a hit lacks {}",
                    p.display()
                );
            }
        }
        Some("miss") => assert!(
            names(mnt).is_empty(),
            "round {round}: a miss is not clean: {:?}",
            names(mnt)
        ),
        _ => panic!("round {round}: unexpected mount outcome {v}"),
    }
}

/// The states a commit killed while remounting leaves, made by construction: a mount of the
/// store nobody records (the dead commit's run directory was removed by `umount` before its
/// daemon's mount came up), also stacked twice at one path, and a complete remount whose
/// record never got its daemon pid (the commit died right after the daemon was ready). Each is
/// cleared by the command that meets it: `umount`, the next `mount`, `gc`.
#[test]
fn umount_mount_and_gc_clear_what_a_killed_commit_left_at_the_mountpoint() {
    if !can_mount() {
        return;
    }
    let env = Env::new();
    let mnt = env.dir("mnt");
    let m = mnt.to_str().unwrap();
    // A published key, as a commit's remount mounts it.
    let (_g, v) = env.mount("k", &mnt);
    assert_eq!(v["result"], "miss", "{v}");
    fill(&mnt, 0);
    env.ok(&["commit", m]);
    env.ok(&["umount", m]);
    assert_eq!(mounts_at(&mnt), 0);

    // A recorded-by-nobody mount with the recorded mount of another run stacked on it (the
    // race's end state: the dead commit's daemon mounted after `umount` removed its run, just
    // before the next `mount`'s daemon). layercache never stacks by itself, so the recorded one
    // is mounted beside and bound over: `umount` removes both.
    let (_g, v) = env.mount("k", &mnt);
    fs::remove_file(env.run_dir(v["run"].as_str().unwrap()).join("run.json")).unwrap();
    let beside = env.dir("beside");
    let (_g3, v3) = env.mount("k", &beside);
    run_ok(Command::new("mount").arg("--bind").arg(&beside).arg(&mnt));
    edit_record(&env.run_dir(v3["run"].as_str().unwrap()), |r| {
        r["mountpoint"] = m.into();
    });
    assert_eq!(mounts_at(&mnt), 2);
    let out = env.cmd(&["umount", m]).output().unwrap();
    assert!(
        out.status.success(),
        "umount of a dead commit's mounts: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(mounts_at(&mnt), 0, "umount left a mount at {m}");

    // The same leftover meets the next `mount`: cleared, then mounted once.
    let (_g, v) = env.mount("k", &mnt);
    fs::remove_file(env.run_dir(v["run"].as_str().unwrap()).join("run.json")).unwrap();
    let (_g2, v2) = env.mount("k", &mnt);
    assert_eq!(mounts_at(&mnt), 1, "mount stacked over a leftover");
    assert_complete_or_clean(&mnt, &v2, 0);
    assert_eq!(v2["result"], "hit", "{v2}");
    env.ok(&["umount", m]);
    assert_eq!(mounts_at(&mnt), 0);

    // And `gc`.
    let (_g, v) = env.mount("k", &mnt);
    fs::remove_file(env.run_dir(v["run"].as_str().unwrap()).join("run.json")).unwrap();
    env.ok(&["gc"]);
    assert_eq!(mounts_at(&mnt), 0, "gc left a dead commit's mount at {m}");

    // A complete remount whose commit died before recording its daemon: the next `mount`.
    let (_g, v) = env.mount("k", &mnt);
    edit_record(&env.run_dir(v["run"].as_str().unwrap()), |r| {
        r["daemon_pid"] = 0.into();
        r["mounter_pid"] = dead_pid().into();
    });
    let (_g2, v2) = env.mount("k", &mnt);
    assert_eq!(mounts_at(&mnt), 1);
    assert_eq!(v2["result"], "hit", "{v2}");
    assert_ne!(v2["run"], v["run"]);
    env.ok(&["umount", m]);
    assert_eq!(mounts_at(&mnt), 0);
}

/// kill -9 of `layercache commit MNT` at random moments over its whole duration (unmount,
/// promote, publish, remount), N rounds; after each: `umount` (and on some rounds `gc` before or
/// after it) leaves nothing mounted at MNT, the next `mount` of the key mounts exactly once, and
/// is a complete hit or a clean miss.
#[test]
fn commit_killed_at_random_moments_leaves_no_stacked_mount() {
    if !can_mount() {
        return;
    }
    let env = Env::new();
    let mnt = env.dir("mnt");
    let m = mnt.to_str().unwrap();
    // How long a whole commit takes here and now: the kills spread over 0..1.5× that.
    let (_g, v) = env.mount("calibrate", &mnt);
    assert_eq!(v["result"], "miss", "{v}");
    fill(&mnt, 0);
    let t = Instant::now();
    env.ok(&["commit", m]);
    let span = t.elapsed().mul_f64(1.5).max(Duration::from_millis(50));
    env.ok(&["umount", m]);
    let mut seed = std::process::id() as u64 ^ t.elapsed().as_nanos() as u64;
    let rounds = 60;
    let (mut hits, mut misses) = (0, 0);
    for round in 1..=rounds {
        let key = format!("r{round}");
        let (_g, v) = env.mount(&key, &mnt);
        assert_eq!(v["result"], "miss", "{v}");
        fill(&mnt, round);
        // xorshift: a different kill point each round, not the same few.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let delay = span.mul_f64((seed % 1000) as f64 / 1000.0);
        let mut commit = env
            .cmd(&["commit", m])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(delay);
        let _ = commit.kill();
        commit.wait().unwrap();
        if round % 3 == 1 {
            env.ok(&["gc"]);
            assert!(
                mounts_at(&mnt) <= 1,
                "round {round}: stacked mounts after gc"
            );
        }
        // Nothing left to unmount (the commit died between the old run and the new record)
        // is "no layercache mount there"; anything else must succeed.
        let out = env.cmd(&["umount", m]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() || err.contains("no layercache mount there"),
            "round {round} (kill after {delay:?}): umount: {err}"
        );
        assert_eq!(
            mounts_at(&mnt),
            0,
            "round {round} (kill after {delay:?}): umount left a mount"
        );
        if round % 3 == 2 {
            env.ok(&["gc"]);
        }
        let (_g2, v2) = env.mount(&key, &mnt);
        assert_eq!(
            mounts_at(&mnt),
            1,
            "round {round} (kill after {delay:?}): stacked mounts"
        );
        assert_complete_or_clean(&mnt, &v2, round);
        if v2["result"] == "hit" {
            hits += 1;
        } else {
            misses += 1;
        }
        env.ok(&["umount", m]);
        assert_eq!(mounts_at(&mnt), 0, "round {round}: umount left a mount");
    }
    eprintln!("{rounds} kills: {hits} hits, {misses} misses (kills spread over {span:?})");
}
