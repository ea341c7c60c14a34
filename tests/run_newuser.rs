//! What a new user meets in `layercache run` (issue 32), through the binary with
//! `--sandbox none`: what is said while setup runs, where a failed setup's logs are kept, a
//! full store, and build output saved from a cache view. Real FUSE mounts as root (skipped
//! otherwise, a failure when `CI` is set); each test's [`Sandbox`] unmounts what is left
//! below it, even when the test panics.

#[path = "common/run.rs"]
mod run_common;

use std::process::Command;

use run_common::{BIN, Sandbox, can_mount, run_ok};

fn spec(setup: &str, extra: &str) -> String {
    format!(
        "project = \"p\"\n[[cache]]\nid = \"deps\"\nkey_files = [\"deps.lock\"]\nenv = {{ DEPS = \
         \"{{mount}}\" }}\nsetup = {setup:?}\n{extra}"
    )
}

/// A sandbox whose workdir holds the `deps.lock` [`spec`] keys on; `None` (a skip) when this
/// machine cannot mount.
fn deps_sandbox() -> Option<Sandbox> {
    if !can_mount() {
        return None;
    }
    let sb = Sandbox::new();
    std::fs::write(sb.work().join("deps.lock"), "a=1\n").unwrap();
    Some(sb)
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Before setup a line says what was found and what runs; while it runs a plain heartbeat
/// line (stderr is a pipe here, not a terminal) gives the time and bytes written; with
/// `--json` the heartbeat is not printed.
#[test]
fn setup_is_announced_and_a_heartbeat_runs_while_it_does() {
    let Some(sb) = deps_sandbox() else { return };
    let s = sb.write_spec(
        "s.toml",
        &spec("head -c 70000 /dev/zero > \"$DEPS/f\"; sleep 3", ""),
    );
    let fast = [("LAYERCACHE_PROGRESS_SECS", "1")];
    let out = sb.run_cmd(&[], &s, &["true"], &fast);
    assert_eq!(out.status.code(), Some(0));
    let err = stderr(&out);
    assert!(
        err.contains(
            "layercache: deps: miss (no layer to restore from), running setup: head -c 70000 /dev/zero"
        ),
        "{err}"
    );
    let beat = err
        .lines()
        .find(|l| l.starts_with("layercache: deps: setup running for "))
        .unwrap_or_else(|| panic!("no heartbeat: {err}"));
    assert!(beat.ends_with("68.4 KiB written"), "{beat}");
    assert!(!err.contains('\r'), "no redraws off a terminal: {err:?}");
    // The summary follows the heartbeats.
    let announced = err.find("running setup").unwrap();
    let summary = err.find("layercache: deps miss in").unwrap();
    assert!(announced < summary, "{err}");

    // A restore names the layer it starts from; --json prints no heartbeat.
    std::fs::write(sb.work().join("deps.lock"), "a=2\n").unwrap();
    let s2 = sb.write_spec("s2.toml", &spec("sleep 3", ""));
    let out = sb.run_cmd(&["--json"], &s2, &["true"], &fast);
    assert_eq!(out.status.code(), Some(0));
    let err = stderr(&out);
    assert!(!err.contains("running for"), "{err}");
    assert!(
        err.contains("layercache: deps: restore from the layer of key deps-"),
        "{err}"
    );
}

/// Asserts the failed run's `failed/<run>/deps/<kept>` holds the E404 log the setup wrote at
/// `<mount root>/<seen>` and that the failure output names it; returns the run's kept dir.
fn assert_log_kept(sb: &Sandbox, err: &str, kept: &str, seen: &str) -> std::path::PathBuf {
    let run = sb.events()[0]["run"].as_str().unwrap().to_string();
    let dir = sb
        .path("store")
        .join(format!("v1/projects/p/failed/{run}/deps"));
    let kept = dir.join(kept);
    assert_eq!(
        std::fs::read_to_string(&kept).unwrap_or_else(|e| panic!("{}: {e}; {err}", kept.display())),
        "npm error code E404\n"
    );
    let view = sb.path("cache").join(seen);
    assert!(
        err.contains(&format!(
            "setup's log {} is kept as {}",
            view.display(),
            kept.display()
        )),
        "{err}"
    );
    dir
}

/// A setup that logs into another cache's view (npm's `_logs` live in the npm cache while the
/// node_modules setup fails) has that log kept too, under `other-caches/<id>/`, and named in
/// the failure line by the path the tool printed.
#[test]
fn a_failed_setups_log_in_another_caches_view_is_kept() {
    let Some(sb) = deps_sandbox() else { return };
    let s = sb.write_spec(
        "s.toml",
        "project = \"p\"\n\
         [[cache]]\nid = \"npmc\"\nkey_files = [\"deps.lock\"]\nenv = { NPMC = \"{mount}\" }\n\
         setup = \"echo cached > $NPMC/index\"\n\
         [[cache]]\nid = \"deps\"\nkey_files = [\"deps.lock\"]\n\
         setup = \"mkdir -p $NPMC/_logs; echo 'npm error code E404' > $NPMC/_logs/t-debug-0.log; exit 1\"\n",
    );
    let out = sb.run(&s, Some("true"));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert_log_kept(
        &sb,
        &err,
        "other-caches/npmc/_logs/t-debug-0.log",
        "npmc/_logs/t-debug-0.log",
    );
    assert!(sb.mounts_below().is_empty());
}

/// A failed setup's log files (written into its view, which goes with the run) are kept in
/// the store's `failed/<run>/<cache>`, named in the failure line, and listed by `gc`.
#[test]
fn a_failed_setups_logs_are_kept_and_named() {
    let Some(sb) = deps_sandbox() else { return };
    let s = sb.write_spec(
        "s.toml",
        &spec(
            "mkdir \"$DEPS/_logs\"; echo 'npm error code E404' > \"$DEPS/_logs/t-debug-0.log\"; \
             echo data > \"$DEPS/pkg.js\"; echo fetching; echo 'npm error 404 left-pad' >&2; \
             exit 1",
            "",
        ),
    );
    let out = sb.run(&s, Some("true"));
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    let dir = assert_log_kept(&sb, &err, "_logs/t-debug-0.log", "deps/_logs/t-debug-0.log");
    assert!(!dir.join("pkg.js").exists(), "only log files are kept");
    // Its output (stderr is not a terminal here) went through and its end is kept.
    assert!(err.contains("fetching\nnpm error 404 left-pad\n"), "{err}");
    assert_eq!(
        std::fs::read_to_string(dir.join("output.txt")).unwrap(),
        "fetching\nnpm error 404 left-pad\n"
    );
    assert!(
        err.contains(&format!(
            "the end of its output and the logs it wrote are kept for 7 days in {}",
            dir.display()
        )),
        "{err}"
    );
    assert!(sb.mounts_below().is_empty());
    // gc lists it (and keeps it: it is young).
    let gc = run_ok(
        Command::new(BIN)
            .arg("--store")
            .arg(sb.path("store"))
            .arg("gc"),
    );
    let text = String::from_utf8_lossy(&gc.stdout);
    assert!(
        text.contains(&dir.parent().unwrap().display().to_string()),
        "{text}"
    );
    assert!(dir.join("_logs/t-debug-0.log").exists());
}

/// A small ext4 image loop-mounted at a path (a store on a bounded filesystem, never the
/// machine's disk); Drop unmounts it (lazily as a last resort).
struct LoopFs {
    mnt: std::path::PathBuf,
}

impl LoopFs {
    /// `None` (a skip) when mkfs.ext4 or a loop mount is not available.
    fn new(image: &std::path::Path, mnt: &std::path::Path, mib: u64) -> Option<LoopFs> {
        LoopFs::with_mkfs_args(image, mnt, mib, &[])
    }

    /// [`LoopFs::new`] with more mkfs.ext4 arguments (`-N 3000`: that many inodes).
    fn with_mkfs_args(
        image: &std::path::Path,
        mnt: &std::path::Path,
        mib: u64,
        args: &[&str],
    ) -> Option<LoopFs> {
        let f = std::fs::File::create(image).unwrap();
        f.set_len(mib << 20).unwrap();
        let mkfs = Command::new("mkfs.ext4")
            .args(["-q", "-F", "-m", "0"])
            .args(args)
            .arg(image)
            .output()
            .ok()?;
        if !mkfs.status.success() {
            return None;
        }
        let m = Command::new("mount")
            .args(["-o", "loop"])
            .arg(image)
            .arg(mnt)
            .output()
            .ok()?;
        m.status.success().then(|| LoopFs {
            mnt: mnt.to_path_buf(),
        })
    }

    fn avail(&self) -> u64 {
        let out = Command::new("df")
            .args(["-B1", "--output=avail"])
            .arg(&self.mnt)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .nth(1)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.mnt)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
    }
}

/// [`deps_sandbox`] with its store on a 48 MiB ext4 image; `None` (a skip) without mounts,
/// mkfs.ext4 or loop devices.
fn full_store_sandbox() -> Option<(Sandbox, LoopFs)> {
    let sb = deps_sandbox()?;
    let Some(fs) = LoopFs::new(&sb.path("store.img"), &sb.path("store"), 48) else {
        run_common::skip_or_fail("no mkfs.ext4 or loop mount");
        return None;
    };
    Some((sb, fs))
}

/// The directories left in a project's `runs/` and `staging/`.
fn leftovers(store: &std::path::Path) -> Vec<String> {
    let mut v = Vec::new();
    for d in ["runs", "staging"] {
        let dir = store.join("v1/projects/p").join(d);
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            v.push(format!("{d}/{}", e.file_name().to_string_lossy()));
        }
    }
    v
}

/// A setup that fills the store's filesystem ends with one plain line (full, how much it
/// holds and has free, nothing published, what to do), its upper removed at once, and its
/// event recorded.
#[test]
fn a_setup_that_fills_the_store_says_so_plainly_and_leaves_nothing() {
    let Some((sb, fs)) = full_store_sandbox() else {
        return;
    };
    let free_before = fs.avail();
    let s = sb.write_spec(
        "s.toml",
        &spec("head -c 200M /dev/zero > \"$DEPS/big\"", ""),
    );
    let out = sb.run(&s, Some("true"));
    assert_ne!(out.status.code(), Some(0));
    let err = stderr(&out);
    assert!(
        err.contains("layercache: the store's filesystem is full"),
        "{err}"
    );
    assert!(err.contains("nothing was published"), "{err}");
    assert!(err.contains("layercache gc"), "{err}");
    for internal in [".tmp", "staging/", "runs/"] {
        assert!(!err.contains(internal), "{internal} in {err}");
    }
    assert_eq!(leftovers(&sb.path("store")), Vec::<String>::new());
    assert!(sb.mounts_below().iter().all(|m| !m.contains("/runs/")));
    let ev = sb.events();
    assert_eq!(ev.len(), 1, "the event is recorded");
    assert_eq!(ev[0]["published"], false);
    assert!(
        fs.avail() + (4 << 20) >= free_before,
        "the upper's space is free again"
    );
}

/// A setup that runs the store's filesystem out of inodes (bytes to spare) gets the same
/// plain line, which says the inodes ran out, instead of a failed setup whose logs could not
/// be kept.
#[test]
fn a_setup_that_uses_up_the_stores_inodes_says_so_plainly() {
    let Some(sb) = deps_sandbox() else {
        return;
    };
    let image = sb.path("store.img");
    let Some(_fs) = LoopFs::with_mkfs_args(&image, &sb.path("store"), 64, &["-N", "3000"]) else {
        run_common::skip_or_fail("no mkfs.ext4 or loop mount");
        return;
    };
    let s = sb.write_spec(
        "s.toml",
        &spec("seq 1 5000 | sed \"s|^|$DEPS/f|\" | xargs touch", ""),
    );
    let out = sb.run(&s, Some("true"));
    assert_ne!(out.status.code(), Some(0));
    let err = stderr(&out);
    assert!(
        err.contains("layercache: the store's filesystem is full") && err.contains(" inodes, "),
        "{err}"
    );
    assert!(err.contains("nothing was published"), "{err}");
    assert!(!err.contains("could not be kept"), "{err}");
    assert_eq!(leftovers(&sb.path("store")), Vec::<String>::new());
    assert!(sb.mounts_below().iter().all(|m| !m.contains("/runs/")));
}

/// A setup that fits, leaving a few dozen of the store's inodes free, whose promote then runs
/// out of them (each new object directory `objects/<aa>` is an inode; the objects themselves
/// are links to the upper's files): the plain line says the inodes ran out, as they were when
/// promote met `ENOSPC` — its cleanup removes the upper, so they are all free again by the
/// time the line is written.
#[test]
fn a_promote_that_uses_up_the_stores_inodes_says_so_plainly() {
    let Some(sb) = deps_sandbox() else {
        return;
    };
    let store = sb.path("store");
    let image = sb.path("store.img");
    let Some(_fs) = LoopFs::with_mkfs_args(&image, &store, 64, &["-N", "3000"]) else {
        run_common::skip_or_fail("no mkfs.ext4 or loop mount");
        return;
    };
    // Distinct contents: about one new object directory per file until all 256 are there.
    let setup = "n=$(( $(stat -f -c %d \"$STORE\") - 40 )); i=0; \
                 while [ $i -lt $n ]; do echo $i > \"$DEPS/f$i\"; i=$((i+1)); done";
    let s = sb.write_spec("s.toml", &spec(setup, ""));
    let out = sb.run_cmd(&[], &s, &["true"], &[("STORE", store.to_str().unwrap())]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(!err.contains("setup of cache"), "the setup fit: {err}");
    assert!(
        err.contains("layercache: the store's filesystem is full")
            && err.contains("promoting cache \"deps\" ran out of space")
            && err.contains(" inodes, 0 free)"),
        "{err}"
    );
    assert!(err.contains("nothing was published"), "{err}");
    assert_eq!(leftovers(&store), Vec::<String>::new());
    assert!(sb.mounts_below().iter().all(|m| !m.contains("/runs/")));
    let st = Command::new("stat")
        .args(["-f", "-c", "%c %d"])
        .arg(&store)
        .output()
        .unwrap();
    let st = String::from_utf8_lossy(&st.stdout).into_owned();
    let (total, free) = st.trim().split_once(' ').unwrap();
    let (total, free): (u64, u64) = (total.parse().unwrap(), free.parse().unwrap());
    assert!(
        free > total / 2,
        "the upper's inodes are free again: {free} of {total}"
    );
    let ev = sb.events();
    assert_eq!(ev.len(), 1, "the event is recorded");
    assert_eq!(ev[0]["published"], false);
}

/// Setup succeeds but the store's filesystem is full when its tree is promoted: the same
/// plain line, nothing published, the run's upper and staging removed, and the event still
/// recorded (its space was reserved before setup).
#[test]
fn a_promote_that_finds_the_store_full_says_so_plainly_and_leaves_nothing() {
    let Some((sb, fs)) = full_store_sandbox() else {
        return;
    };
    let filler = sb.path("store").join("filler");
    let s = sb.write_spec(
        "s.toml",
        &spec(
            "for i in 1 2 3 4 5 6 7 8; do mkdir -p \"$DEPS/d$i\"; echo $i > \"$DEPS/d$i/f\"; \
             done; head -c 200M /dev/zero > \"$FILLER\"; true",
            "",
        ),
    );
    let out = sb.run_cmd(&[], &s, &["true"], &[("FILLER", filler.to_str().unwrap())]);
    assert_ne!(out.status.code(), Some(0));
    let err = stderr(&out);
    assert!(
        err.contains("layercache: the store's filesystem is full"),
        "{err}"
    );
    assert!(err.contains("nothing was published"), "{err}");
    for internal in [".tmp", "staging/", "runs/", ".run.json"] {
        assert!(!err.contains(internal), "{internal} in {err}");
    }
    assert_eq!(leftovers(&sb.path("store")), Vec::<String>::new());
    let ev = sb.events();
    assert_eq!(ev.len(), 1, "the event is recorded on a full disk");
    assert_eq!(ev[0]["published"], false);
    std::fs::remove_file(&filler).unwrap();
    drop(fs);
}

/// `save = "success"`: after COMMAND exits 0, what it wrote into the cache's view is promoted
/// as a newer layer of the same key (stored objects linked, not copied), and the next run hits
/// that layer; a failing COMMAND or an unchanged view saves nothing; without `save` a hit's
/// writes stay private.
#[test]
fn save_success_keeps_build_output_for_the_next_run() {
    let Some(sb) = deps_sandbox() else { return };
    let setup = "echo dep > \"$DEPS/dep\"";
    let s = sb.write_spec("s.toml", &spec(setup, "save = \"success\"\n"));
    let build = "mkdir -p \"$DEPS/target\" && echo built > \"$DEPS/target/out\"";
    let out = sb.run(&s, Some(build));
    assert_eq!(out.status.code(), Some(0));
    let err = stderr(&out);
    assert!(
        err.contains("layercache: deps: saved what the run wrote to ")
            && err.contains("as a newer layer of its key (2 files, ")
            && err.contains("new 1 file, 6 B)"),
        "{err}"
    );
    let named: Vec<_> = (sb.ls().into_iter())
        .filter(|l| !l["keys"].as_array().unwrap().is_empty())
        .collect();
    assert_eq!(named.len(), 1, "the key names one layer");
    assert!(
        !named[0]["parent"].is_null(),
        "the saved layer's parent is setup's"
    );

    // The save is an event of the run, as a miss's publish is (not counted as a preparation).
    let events = sb.events();
    assert_eq!(events.len(), 2, "{events:?}");
    let save = &events[1];
    assert_eq!(
        (&save["saved"], &save["published"]),
        (&true.into(), &true.into())
    );
    assert_eq!((&save["files"], &save["new_files"]), (&2.into(), &1.into()));
    assert_eq!(save["run"], events[0]["run"]);
    assert!(events[0].get("saved").is_none(), "{events:?}");

    // The next run hits the saved layer; an unchanged view saves nothing.
    let layers = sb.ls().len();
    let out = sb.run(&s, Some("cat \"$DEPS/target/out\" \"$DEPS/dep\""));
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "built\ndep\n");
    let events = sb.events();
    assert_eq!(events[2]["result"], "hit", "{events:?}");
    assert!(!stderr(&out).contains("saved"), "{}", stderr(&out));
    assert_eq!(sb.ls().len(), layers);

    // A failing COMMAND saves nothing.
    let out = sb.run(&s, Some("echo x > \"$DEPS/failed\"; exit 5"));
    assert_eq!(out.status.code(), Some(5));
    let out = sb.run(&s, Some("test ! -e \"$DEPS/failed\""));
    assert_eq!(
        out.status.code(),
        Some(0),
        "a failed COMMAND's writes were saved"
    );

    // Without `save`, a hit's writes are private to the run.
    let plain = sb.write_spec("plain.toml", &spec(setup, "").replace("\"p\"", "\"q\""));
    assert_eq!(sb.run(&plain, Some(build)).status.code(), Some(0));
    let out = sb.run(&plain, Some("test ! -e \"$DEPS/target/out\""));
    assert_eq!(out.status.code(), Some(0));
    assert!(sb.mounts_below().is_empty());
}

/// A layer saved after COMMAND (`save = "success"`) is pushed to the remote tier as a miss's
/// layer is: a remote that lacks the key (here its key record removed) gets the saved layer;
/// one that holds the key keeps it (remote keys are create-only).
#[test]
fn a_saved_layer_is_pushed_to_the_remote_tier() {
    let Some(sb) = deps_sandbox() else { return };
    let remote = sb.path("remote");
    let url = format!("file://{}", remote.display());
    let env = [("LAYERCACHE_REMOTE", url.as_str())];
    let s = sb.write_spec(
        "s.toml",
        &spec("echo dep > \"$DEPS/dep\"", "save = \"success\"\n"),
    );
    let out = sb.run_cmd(&[], &s, &["true"], &env);
    assert_eq!(out.status.code(), Some(0));
    let remote_layers = || {
        let out = run_ok(
            Command::new(BIN)
                .arg("--store")
                .arg(sb.path("store"))
                .args(["--json", "remote", "ls"])
                .envs(env),
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let layers: Vec<String> = (v.as_array().unwrap().iter())
            .map(|k| k["layer"].as_str().unwrap().to_string())
            .collect();
        layers
    };
    let first = remote_layers();
    assert_eq!(first.len(), 1, "the miss pushed its layer");
    // The remote loses the key (its layer's objects stay); the next run hits and saves.
    std::fs::remove_dir_all(remote.join("v1/projects/p/caches")).unwrap();
    let out = sb.run_cmd(&[], &s, &["sh", "-c", "echo built > \"$DEPS/out\""], &env);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        stderr(&out).contains("deps: saved what the run wrote"),
        "{}",
        stderr(&out)
    );
    let saved: Vec<_> = (sb.ls().into_iter())
        .filter(|l| !l["keys"].as_array().unwrap().is_empty())
        .map(|l| l["layer"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(saved.len(), 1);
    assert_ne!(saved, first);
    assert_eq!(remote_layers(), saved, "the saved layer was not pushed");
    assert!(sb.mounts_below().is_empty());
}

/// `run` without `--spec` or `--project` reads `layercache.toml` of the workdir; when there is
/// none it says which file it looked for and names both flags (exit 2).
#[test]
fn run_without_spec_reads_layercache_toml_or_says_what_to_pass() {
    let sb = Sandbox::new();
    let run = |dir: &std::path::Path| {
        Command::new(BIN)
            .arg("--store")
            .arg(sb.path("store"))
            .args(["run", "--workdir"])
            .arg(dir)
            .args(["--", "echo", "ran"])
            .output()
            .unwrap()
    };
    let out = run(&sb.work());
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    let looked = sb.work().join("layercache.toml");
    assert!(
        err.contains(&format!("no spec: {} does not exist", looked.display()))
            && err.contains("--spec FILE")
            && err.contains("--project P"),
        "{err}"
    );
    std::fs::write(&looked, "project = \"p\"\n").unwrap();
    let out = run(&sb.work());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ran\n");
}

/// A bare `run` (no COMMAND) prepares the caches and says that no command ran and how to
/// give one; a run with a COMMAND does not say it.
#[test]
fn a_run_without_command_says_so() {
    let Some(sb) = deps_sandbox() else { return };
    let s = sb.write_spec("s.toml", &spec("echo x > \"$DEPS/f\"", ""));
    let none: [&str; 0] = [];
    let out = sb.run_cmd(&[], &s, &none, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("layercache: no COMMAND given: only the caches were prepared; `layercache run -- COMMAND…`"),
        "{err}"
    );
    let out = sb.run_cmd(&[], &s, &["true"], &[]);
    assert_eq!(out.status.code(), Some(0));
    assert!(!stderr(&out).contains("no COMMAND"), "{}", stderr(&out));
    assert!(sb.mounts_below().is_empty());
}

/// Inode flags a setup set on files of its cache (`chattr +i`, `+a`): a failed run's upper is
/// still removed (so `gc` never meets EPERM), and a successful one is promoted without them.
#[test]
fn immutable_and_append_only_files_never_block_removal_nor_reach_a_layer() {
    let chattr = Command::new("chattr").arg("-V").output().is_ok();
    if !chattr && run_common::skip_or_fail("needs chattr (e2fsprogs)") {
        return;
    }
    let Some(sb) = deps_sandbox() else { return };
    let flags = "mkdir \"$DEPS/d\" && echo i > \"$DEPS/d/i\" && echo a > \"$DEPS/a\" && \
                 chattr +i \"$DEPS/d/i\" \"$DEPS/d\" && chattr +a \"$DEPS/a\"";
    let failing = sb.write_spec("f.toml", &spec(&format!("{flags} && exit 4"), ""));
    let out = sb.run(&failing, Some("true"));
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert_eq!(leftovers(&sb.path("store")), Vec::<String>::new());
    let gc = Command::new(BIN)
        .arg("--store")
        .arg(sb.path("store"))
        .arg("gc")
        .output()
        .unwrap();
    assert!(gc.status.success(), "{}", stderr(&gc));

    let ok = sb.write_spec("ok.toml", &spec(flags, ""));
    let out = sb.run(&ok, Some("lsattr -d \"$DEPS/d/i\" \"$DEPS/d\" \"$DEPS/a\""));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let attrs = String::from_utf8_lossy(&out.stdout);
    for l in attrs.lines() {
        let f = l.split_whitespace().next().unwrap();
        assert!(!f.contains('i') && !f.contains('a'), "{attrs}");
    }
    assert_eq!(attrs.lines().count(), 3, "{attrs}");
    let layers = sb.path("store").join("v1/projects/p/layers");
    let lsattr = Command::new("lsattr")
        .arg("-R")
        .arg(&layers)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&lsattr.stdout);
    assert!(
        !text.lines().any(|l| {
            // "<flags> <path>" lines; "<dir>:" headers and blank lines are not flags.
            let f = l.split_whitespace().next().unwrap_or("");
            !f.contains('/') && (f.contains('i') || f.contains('a'))
        }),
        "{text}"
    );
    let gc = Command::new(BIN)
        .arg("--store")
        .arg(sb.path("store"))
        .args(["gc", "--max-size", "0"])
        .output()
        .unwrap();
    assert!(gc.status.success(), "{}", stderr(&gc));
}

/// A cache viewed at `<workdir>/deps`: a file of that name on the host is refused naming it
/// (exit 2, not `File exists (os error 17)`); a directory with files is said to be hidden for
/// the run and left as it is.
#[test]
fn a_host_file_where_a_cache_is_viewed_is_named() {
    let Some(sb) = deps_sandbox() else { return };
    let s = sb.write_spec(
        "s.toml",
        &spec("echo x > \"$DEPS/x\"", "mountpoint = \"{workdir}/deps\"\n"),
    );
    let host = sb.work().join("deps");
    std::fs::write(&host, "not a dir").unwrap();
    let out = sb.run(&s, Some("true"));
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "cache \"deps\": {} is a file on the host, but the cache is mounted there",
            host.display()
        )),
        "{err}"
    );
    assert!(!err.contains("os error 17"), "{err}");
    assert!(sb.mounts_below().is_empty());
    std::fs::remove_file(&host).unwrap();
    std::fs::create_dir(&host).unwrap();
    std::fs::write(host.join("old"), "mine").unwrap();
    let out = sb.run(&s, Some("test ! -e deps/old && cat deps/x"));
    assert_eq!(out.status.code(), Some(0));
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "layercache: deps: the host's {} (1 entry) is hidden under the cache",
            host.display()
        )),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(host.join("old")).unwrap(), "mine");
}

/// A project without the lockfile its cache is keyed on is told how to make one without
/// installing anything.
#[test]
fn a_missing_lockfile_comes_with_the_command_that_makes_it() {
    let sb = Sandbox::new();
    std::fs::write(sb.work().join("package.json"), "{}").unwrap();
    let s = sb.write_spec(
        "s.toml",
        "project = \"p\"\n[[cache]]\nid = \"npm\"\npreset = \"npm\"\n",
    );
    let out = Command::new(BIN)
        .arg("--store")
        .arg(sb.path("store"))
        .args(["key", "--spec"])
        .arg(&s)
        .arg("--workdir")
        .arg(sb.work())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains(
            "package.json is there: `npm install --package-lock-only` writes package-lock.json"
        ),
        "{err}"
    );
}

/// Options a variable gives (LAYERCACHE_STORE, LAYERCACHE_IMAGE) still work, and a usage line
/// does not list them as if they were required arguments.
#[test]
fn env_backed_options_work_and_stay_out_of_usage_lines() {
    let sb = Sandbox::new();
    let missing = sb.path("no-store");
    let out = Command::new(BIN)
        .env("LAYERCACHE_STORE", &missing)
        .arg("ls")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains(&format!("no layercache store at {}", missing.display())),
        "{}",
        stderr(&out)
    );
    // A file where the store should be is named as what it is, for every command.
    let file = sb.path("a-file");
    std::fs::write(&file, "x").unwrap();
    for cmd in [&["ls"][..], &["gc"], &["stats"]] {
        let out = Command::new(BIN)
            .arg("--store")
            .arg(&file)
            .args(cmd)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{cmd:?}");
        assert!(
            stderr(&out).contains(&format!("{}: not a directory", file.display())),
            "{cmd:?}: {}",
            stderr(&out)
        );
    }
    let out = Command::new(BIN)
        .env("LAYERCACHE_STORE", &missing)
        .env("LAYERCACHE_IMAGE", "img")
        .arg("mount")
        .output()
        .unwrap();
    let err = stderr(&out);
    let usage = err.lines().find(|l| l.starts_with("Usage:")).unwrap();
    assert!(
        !usage.contains("--store") && !usage.contains("--image"),
        "{usage}"
    );
    // The image a variable names enters the key as --image does.
    std::fs::write(sb.work().join("deps.lock"), "a=1\n").unwrap();
    let s = sb.write_spec("s.toml", &spec("true", ""));
    let key = |image: Option<&str>, flag: Option<&str>| {
        let mut c = Command::new(BIN);
        c.arg("--store")
            .arg(sb.path("store"))
            .args(["--json", "key", "--spec"]);
        c.arg(&s)
            .arg("--workdir")
            .arg(sb.work())
            .env_remove("LAYERCACHE_IMAGE");
        if let Some(i) = image {
            c.env("LAYERCACHE_IMAGE", i);
        }
        if let Some(f) = flag {
            c.args(["--image", f]);
        }
        String::from_utf8_lossy(&run_ok(&mut c).stdout).into_owned()
    };
    let (plain, by_env, by_flag) = (
        key(None, None),
        key(Some("img"), None),
        key(None, Some("img")),
    );
    assert_ne!(plain, by_env);
    assert_eq!(by_env, by_flag);
}

/// A warning the code logs (here: the event log cannot be written) is one line of the tool's
/// own, `layercache: warning: …`, not a tracing record with a timestamp and a module path.
#[test]
fn logged_warnings_are_the_tools_own_lines() {
    let Some(sb) = deps_sandbox() else { return };
    std::fs::create_dir_all(sb.path("store/events.jsonl")).unwrap();
    let s = sb.write_spec("s.toml", &spec("true", ""));
    let out = sb
        .command(&s, &sb.work(), &[], &["true"])
        .env_remove("RUST_LOG")
        .env_remove("LAYERCACHE_LOG")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let err = stderr(&out);
    let line = err
        .lines()
        .find(|l| l.contains("telemetry"))
        .unwrap_or_else(|| panic!("no telemetry warning: {err}"));
    assert!(
        line.starts_with("layercache: warning: telemetry: "),
        "{line}"
    );
    assert!(
        !line.contains("WARN") && !line.contains("layercache::run"),
        "{line}"
    );
}

/// A view nested below the mount root (`{mount_root}/a/b`, beside one at `{mount_root}/c`)
/// works with `--sandbox none` as with bwrap: each step's namespace makes the view's parents
/// on its tmpfs over the mount root (the setup exited 127, ENOENT, when only the last level
/// was made), and nothing of them is left on the host.
#[test]
fn a_view_nested_below_the_mount_root_works_without_a_sandbox() {
    let Some(sb) = deps_sandbox() else { return };
    let extra = "mountpoint = \"{mount_root}/a/b/deep\"\n[[cache]]\nid = \"flat\"\n\
                 key_files = [\"deps.lock\"]\nmountpoint = \"{mount_root}/c\"\nsetup = \"touch {mount}/x\"\n";
    let s = sb.write_spec("s.toml", &spec("echo dep > \"$DEPS/dep\"", extra));
    let work = sb.work();
    let read = ["sh", "-c", "cat \"$DEPS/dep\"; echo \"$DEPS\""];
    for (n, sandbox) in ["none", "bwrap"].into_iter().enumerate() {
        if sandbox == "bwrap" && which("bwrap").is_none() {
            continue;
        }
        let out = sb.run_flags(&s, &work, &["--sandbox", sandbox], &read);
        assert_eq!(out.status.code(), Some(0), "{sandbox}: {}", stderr(&out));
        let want = format!("\ndep\n{}\n", sb.path("cache/a/b/deep").display());
        let got = String::from_utf8_lossy(&out.stdout);
        assert!(got.ends_with(&want), "{sandbox}: {got}");
        let results: Vec<_> = sb.events().iter().map(|e| e["result"].clone()).collect();
        assert_eq!(results.len(), 2 * (n + 1), "{results:?}");
        assert!(
            !sb.path("cache/a").exists(),
            "{sandbox}: a parent was left on the host"
        );
    }
    assert!(sb.mounts_below().is_empty());
}

fn which(tool: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(tool))
            .find(|f| f.is_file())
    })
}
