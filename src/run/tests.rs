//! Unit tests of the run over a plain-directory fake store.
use super::*;
use std::cell::RefCell;
use std::collections::HashMap;

/// A fake store over plain directories: a "mount" copies the layer into the mountpoint,
/// commit snapshots it, umount empties it.
#[derive(Default)]
struct Fake {
    layers: RefCell<HashMap<String, PathBuf>>,
    mounted: RefCell<HashMap<PathBuf, String>>,
    root: PathBuf,
    log: RefCell<Vec<String>>,
    /// Each mount's directory stands for its private upper too (what the setup wrote).
    uppers: bool,
    /// The salt keyed with first, and the one agreed with the remote (asks counted).
    salt: std::cell::Cell<Option<key::KeySalt>>,
    agreed: Option<key::KeySalt>,
    asked: std::cell::Cell<u32>,
}

fn copy_tree(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap().flatten() {
        let to = dst.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &to);
        } else {
            std::fs::copy(e.path(), to).unwrap();
        }
    }
}

impl Mounter for Fake {
    fn mount(
        &self,
        project: &ProjectId,
        _cache: &CacheId,
        key: &CacheKey,
        restore: &[CacheKey],
        mp: &Path,
    ) -> Result<Mounted> {
        let full = format!("{project}/{key}");
        self.log.borrow_mut().push(format!("mount {key}"));
        std::fs::create_dir_all(mp).unwrap();
        self.mounted
            .borrow_mut()
            .insert(mp.to_path_buf(), full.clone());
        let layers = self.layers.borrow();
        let (result, matched) = if let Some(l) = layers.get(&full) {
            copy_tree(l, mp);
            (CacheResult::Hit, Some(key.to_string()))
        } else if let Some((k, l)) = restore.iter().find_map(|r| {
            layers
                .iter()
                .find(|(k, _)| k.starts_with(&format!("{project}/{r}")))
        }) {
            copy_tree(l, mp);
            (CacheResult::Restore, Some(k.clone()))
        } else {
            (CacheResult::Miss, None)
        };
        Ok(Mounted {
            result,
            matched_key: matched,
            upper: self.uppers.then(|| mp.to_path_buf()),
            bytes: 0,
            files: 0,
            source: mp.to_path_buf(),
            run: "fake".into(),
            pulled: None,
            warm: false,
        })
    }
    fn commit(&self, mp: &Path, _: &crate::why::Inputs) -> Result<Committed> {
        let key = self.mounted.borrow()[mp].clone();
        let dst = self.root.join(key.replace('/', "_"));
        copy_tree(mp, &dst);
        self.layers.borrow_mut().insert(key.clone(), dst);
        self.log.borrow_mut().push(format!("commit {key}"));
        Ok(Committed {
            published: true,
            bytes: 1,
            files: 1,
            remount: None,
            ..Default::default()
        })
    }
    fn key_salt(&self, _: &ProjectId) -> Result<Option<key::KeySalt>> {
        Ok(self.salt.get())
    }
    fn agreed_key_salt(&self, _: &ProjectId) -> Result<Option<key::KeySalt>> {
        self.asked.set(self.asked.get() + 1);
        Ok(self.agreed)
    }
    fn umount(&self, mp: &Path) -> Result<()> {
        self.mounted.borrow_mut().remove(mp);
        std::fs::remove_dir_all(mp).ok();
        std::fs::create_dir_all(mp).ok();
        self.log
            .borrow_mut()
            .push(format!("umount {}", mp.display()));
        Ok(())
    }
}

struct Env {
    _dir: tempfile::TempDir,
    work: PathBuf,
    cfg: RunConfig,
    fake: Fake,
}

fn env(spec: &str, command: &[&str]) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(work.join("deps.lock"), "a=1\n").unwrap();
    let store = dir.path().join("store");
    std::fs::create_dir_all(&store).unwrap();
    let layers = dir.path().join("layers");
    std::fs::create_dir_all(&layers).unwrap();
    let cfg = RunConfig {
        spec: crate::spec::parse(spec).unwrap(),
        paths: Paths {
            workdir: work.clone(),
            mount_root: dir.path().join("mnt"),
            workdir_view: None,
        },
        image: None,
        sandbox: Sandbox::None,
        command: command.iter().map(OsString::from).collect(),
        store,
        json: false,
        run_id: "r".into(),
        user: None,
        rootless: None,
        stored_spec: None,
    };
    Env {
        work,
        cfg,
        fake: Fake {
            root: layers,
            ..Default::default()
        },
        _dir: dir,
    }
}

const SPEC: &str = r#"project = "p"
[[cache]]
id = "deps"
key_files = ["deps.lock"]
env = { DEPS_DIR = "{mount}" }
setup = "echo built > \"$DEPS_DIR/out\" && echo setup-ran >> setup.log"
maintenance = "echo maint >> setup.log"
"#;

/// A custom setup finds its mount through `{mount}` and `$LAYERCACHE_MOUNT`, without an
/// `env` entry.
#[test]
fn scripts_see_their_mount() {
    let spec = r#"project = "p"
[[cache]]
id = "deps"
key_files = ["deps.lock"]
setup = "echo a > {mount}/a && test -n \"$LAYERCACHE_MOUNT\" && test -f \"$LAYERCACHE_MOUNT/a\""
"#;
    let e = env(spec, &[]);
    assert_eq!(run(&e.cfg, &e.fake).unwrap(), 0);
    let events = telemetry::read(&e.cfg.store).unwrap();
    assert_eq!(events[0].exit_status, 0, "setup failed");
    assert!(events[0].published);
}

#[test]
fn miss_then_hit_then_restore() {
    let e = env(
        SPEC,
        &["sh", "-c", "test \"$(cat \"$DEPS_DIR/out\")\" = built"],
    );
    assert_eq!(run(&e.cfg, &e.fake).unwrap(), 0);
    let events = telemetry::read(&e.cfg.store).unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].result, CacheResult::Miss);
    assert!(events[0].published);

    assert_eq!(run(&e.cfg, &e.fake).unwrap(), 0);
    let events = telemetry::read(&e.cfg.store).unwrap();
    assert_eq!(events[1].result, CacheResult::Hit);
    assert!(!events[1].published);
    let log = std::fs::read_to_string(e.work.join("setup.log")).unwrap();
    assert_eq!(log, "setup-ran\nmaint\n");

    std::fs::write(e.work.join("deps.lock"), "a=2\n").unwrap();
    assert_eq!(run(&e.cfg, &e.fake).unwrap(), 0);
    let events = telemetry::read(&e.cfg.store).unwrap();
    assert_eq!(events[2].result, CacheResult::Restore);
    assert_eq!(
        events[2].matched_key.as_deref(),
        Some(format!("p/{}", events[0].key).as_str())
    );
    assert_ne!(events[2].key, events[0].key);
    // everything was unmounted after each run
    assert!(e.fake.mounted.borrow().is_empty());
}

#[test]
fn setup_failure_publishes_nothing_and_passes_status() {
    let spec = SPEC.replace("echo built > \\\"$DEPS_DIR/out\\\" &&", "exit 7;");
    let e = env(&spec, &["true"]);
    let err = run(&e.cfg, &e.fake).unwrap_err();
    assert_eq!(err.exit_code(), 7, "{err}");
    assert!(e.fake.layers.borrow().is_empty());
    assert!(e.fake.mounted.borrow().is_empty());
    let log = e.fake.log.borrow();
    assert!(!log.iter().any(|l| l.starts_with("commit")), "{log:?}");
    let events = telemetry::read(&e.cfg.store).unwrap();
    assert_eq!(events[0].exit_status, 7);
    assert!(!events[0].published);
}

#[test]
fn command_status_passes_through() {
    let e = env(SPEC, &["sh", "-c", "exit 3"]);
    assert_eq!(run(&e.cfg, &e.fake).unwrap(), 3);
    let e = env(SPEC, &["layercache-no-such-command"]);
    assert_eq!(run(&e.cfg, &e.fake).unwrap(), 127);
}

#[test]
fn no_caches_just_runs_the_command() {
    let e = env("project = \"p\"\n", &["sh", "-c", "exit 5"]);
    assert_eq!(run(&e.cfg, &e.fake).unwrap(), 5);
    assert!(e.fake.log.borrow().is_empty());
    assert!(telemetry::read(&e.cfg.store).unwrap().is_empty());
    let e = env("project = \"p\"\n", &[]);
    assert_eq!(run(&e.cfg, &e.fake).unwrap(), 0);
}

#[test]
fn excluded_paths_are_removed_before_commit() {
    let spec = SPEC
        .replace("maintenance =", "exclude = [\"secret*\"]\nmaintenance =")
        .replace(
            "echo built >",
            "touch \\\"$DEPS_DIR/secret.txt\\\" && echo built >",
        );
    let e = env(&spec, &[]);
    assert_eq!(run(&e.cfg, &e.fake).unwrap(), 0);
    let layers = e.fake.layers.borrow();
    let layer = layers.values().next().unwrap();
    assert!(layer.join("out").exists());
    assert!(!layer.join("secret.txt").exists());
}

#[test]
fn duplicate_mountpoints_are_rejected() {
    // The same template is refused when the spec is read (spec::parse_all)…
    let same = format!(
        "{SPEC}[[cache]]\nid = \"b\"\nkey_files = [\"deps.lock\"]\nsetup = \"true\"\nmountpoint = \"{{mount_root}}/deps\"\n"
    );
    assert!(crate::spec::parse(&same).is_err());
    // …and templates that differ as written but meet at one path when the run starts.
    let spec = format!(
        "{SPEC}[[cache]]\nid = \"b\"\nkey_files = [\"deps.lock\"]\nsetup = \"true\"\nmountpoint = \"{{mount_root}}/./deps\"\n"
    );
    let e = env(&spec, &[]);
    let err = run(&e.cfg, &e.fake).unwrap_err().to_string();
    assert!(err.contains("mountpoint"), "{err}");
    assert!(e.fake.log.borrow().is_empty());
}

#[test]
fn bytes_are_shown_in_binary_units() {
    assert_eq!(fmt_bytes(1536), "1.5 KiB");
}

#[test]
fn a_full_disk_is_told_from_the_tools_words() {
    assert!(super::setup::says_no_space(
        b"npm error code ENOSPC\nnpm error syscall write\n"
    ));
    assert!(super::setup::says_no_space(
        b"head: error writing 'standard output': No space left on device\n"
    ));
    assert!(!super::setup::says_no_space(
        b"npm error 404 Not Found - left-pad\n"
    ));
}

/// A failed setup keeps the logs a tool wrote into another cache's view (npm's `_logs` in the
/// npm cache): the others' uppers come from the preparations of the run.
#[test]
fn a_failed_setup_keeps_the_logs_it_wrote_in_another_cache() {
    let spec = r#"project = "p"
[[cache]]
id = "npm"
key_files = ["deps.lock"]
env = { NPM_DIR = "{mount}" }
setup = "true"
[[cache]]
id = "deps"
key_files = ["deps.lock"]
setup = "mkdir -p \"$NPM_DIR/_logs\" && echo oops > \"$NPM_DIR/_logs/x-debug-0.log\" && exit 1"
"#;
    let mut e = env(spec, &[]);
    e.fake.uppers = true;
    let err = run(&e.cfg, &e.fake).unwrap_err().to_string();
    assert!(err.contains("the logs it wrote are kept"), "{err}");
    let found = walk_files(&e.cfg.store);
    assert!(
        found.iter().any(|f| f.ends_with("_logs/x-debug-0.log")),
        "{found:?}"
    );
}

fn walk_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().unwrap().is_dir() {
            out.extend(walk_files(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out
}

/// The event reserve (64 KiB and a scan of `events-reserve/`) is made only when a cache is
/// not a hit: a run of hits has no setup that could fill the store.
#[test]
fn a_run_of_hits_makes_no_event_reserve() {
    let e = env(SPEC, &[]);
    let reserves = e.cfg.store.join("events-reserve");
    assert_eq!(run(&e.cfg, &e.fake).unwrap(), 0);
    assert!(reserves.is_dir(), "a miss reserves room for its event");
    std::fs::remove_dir(&reserves).unwrap();
    assert_eq!(run(&e.cfg, &e.fake).unwrap(), 0);
    let events = telemetry::read(&e.cfg.store).unwrap();
    assert_eq!(events[1].result, CacheResult::Hit);
    assert!(!reserves.exists(), "a hit made a reserve");
}

/// The remote is asked for the agreed salt only when the run may publish (a miss here), not
/// on a hit; when its salt differs from the local one, the run keys and mounts again with it
/// and publishes under the agreed key.
#[test]
fn the_salt_is_agreed_only_before_a_publish() {
    let mut e = env(SPEC, &[]);
    let (local, remote) = (key::KeySalt([1; 32]), key::KeySalt([2; 32]));
    e.fake.salt.set(Some(local));
    e.fake.agreed = Some(remote);
    assert_eq!(run(&e.cfg, &e.fake).unwrap(), 0);
    assert_eq!(e.fake.asked.get(), 1);
    let log = e.fake.log.borrow().clone();
    let mounted: Vec<&String> = log.iter().filter(|l| l.starts_with("mount ")).collect();
    assert_eq!(mounted.len(), 2, "{log:?}");
    assert_ne!(mounted[0], mounted[1], "keyed again with the agreed salt");
    let events = telemetry::read(&e.cfg.store).unwrap();
    assert_eq!(format!("mount {}", events[0].key), *mounted[1]);
    assert!(events[0].published);
    // The store now holds the agreed salt: a hit asks nothing.
    e.fake.salt.set(Some(remote));
    assert_eq!(run(&e.cfg, &e.fake).unwrap(), 0);
    let events = telemetry::read(&e.cfg.store).unwrap();
    assert_eq!(events[1].result, CacheResult::Hit);
    assert_eq!(e.fake.asked.get(), 1, "a hit asked the remote");
}

/// A hit's maintenance of the form `mountpoint -q DIR 2>/dev/null || …` (the download caches'
/// presets) is not started when a cache of the run is viewed at DIR; one testing another
/// directory, or one that would run more after the test, runs as written.
#[test]
fn maintenance_that_would_do_nothing_is_not_started() {
    let spec = r#"project = "p"
[[cache]]
id = "mods"
key_files = ["deps.lock"]
mountpoint = "{workdir}/mods"
setup = "true"
[[cache]]
id = "dl"
key_files = ["deps.lock"]
setup = "true"
maintenance = "mountpoint -q mods 2>/dev/null || echo dl >> maint.log"
[[cache]]
id = "other"
key_files = ["deps.lock"]
setup = "true"
maintenance = "mountpoint -q elsewhere 2>/dev/null || echo other >> maint.log"
[[cache]]
id = "more"
key_files = ["deps.lock"]
setup = "true"
maintenance = "mountpoint -q mods 2>/dev/null || true; echo more >> maint.log"
"#;
    let e = env(spec, &[]);
    assert_eq!(run(&e.cfg, &e.fake).unwrap(), 0);
    assert!(
        !e.work.join("maint.log").exists(),
        "a miss runs no maintenance"
    );
    assert_eq!(run(&e.cfg, &e.fake).unwrap(), 0);
    let log = std::fs::read_to_string(e.work.join("maint.log")).unwrap();
    assert_eq!(log, "other\nmore\n");
    let events = telemetry::read(&e.cfg.store).unwrap();
    assert!(events[4..].iter().all(|e| e.result == CacheResult::Hit));
}
