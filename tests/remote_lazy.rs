//! Lazy remote layers (src/remote/lazy/) against a real SeaweedFS behind the link model
//! (scripts/linkproxy.py: one token bucket shared by all connections, a control file that cuts
//! the link). Runner A fills a layer and pushes it straight to the server; runners B, C, …
//! (empty stores) reach the server through the proxy, and their runs' remote hits mount the
//! layer from its manifest at once and fetch file content on first open.
//!
//! What a COMMAND sees of the daemon's state it reads itself from the store: the run's
//! `lazy-report.json` (rewritten every second by the daemon) and the layer's partial directory;
//! both go when the run ends. Every mount sits below a [`Sandbox`] whose Drop unmounts what is
//! left; the server and the proxy are stopped by pid by their guards.
//!
//! Timing: no assertion says how fast anything is. The fault tests bound a hang (a read that
//! must fail within 20 s, a run that must end within minutes) and rely on one ordering: a
//! 32 MiB object over a 40 Mbit/s link takes ≥ 6 s to arrive, while COMMAND starts well under a
//! second after the mount and cuts the link first thing (background completion waits a moment
//! after the mount besides). The whole file takes about 2.5 minutes (two tests at a time); the
//! slow-link test alone about 45 s.

use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

#[path = "common/remote.rs"]
mod remote_common;
#[path = "common/run.rs"]
mod run_common;

use remote_common::{LinkProxy, Runner, Weed, s3, stderr};
use run_common::{Sandbox, can_mount, have_tool, run_ok, show};

/// The project of every spec here.
const PROJECT: &str = "lazy";

/// A data cache keyed by data.lock whose setup writes small files in several directories
/// (one mode 0600, one 0755), a symlink, a hardlink pair and a file with the same bytes that is
/// not linked, an empty file and an empty directory, a user xattr, and `big.bin`: `big_mib` MiB
/// of random bytes (over a quarter of the 16 MiB pack size: stored alone in the remote).
fn data_spec(big_mib: u32) -> String {
    spec_with_setup(&format!(
        r#"mkdir -p $DATA/a/b $DATA/c $DATA/empty-dir
for i in 1 2 3 4 5; do echo "small $i" > $DATA/a/s$i.txt; done
chmod 600 $DATA/a/s5.txt
echo deep > $DATA/a/b/deep.txt
echo zed > $DATA/c/z.txt
printf '#!/bin/sh\\necho hi\\n' > $DATA/c/run.sh
chmod 755 $DATA/c/run.sh
ln -s a/b/deep.txt $DATA/link
echo pair > $DATA/c/h1
ln $DATA/c/h1 $DATA/c/h2
echo pair > $DATA/c/same
: > $DATA/empty
head -c {big_mib}M /dev/urandom > $DATA/big.bin
python3 -c 'import os, sys; os.setxattr(sys.argv[1], "user.note", b"hello")' $DATA/a/s1.txt"#
    ))
}

/// The spec of a cache `data` keyed by data.lock (`$DATA` its mount) whose setup runs the shell
/// lines `setup` after `set -e`.
fn spec_with_setup(setup: &str) -> String {
    format!(
        r#"project = "{PROJECT}"
[[cache]]
id = "data"
key_files = ["data.lock"]
env = {{ DATA = "{{mount}}" }}
setup = """
set -e
{setup}
"""
"#
    )
}

/// What these tests need besides root and FUSE: python3 (the proxy, the xattr) and sha256sum.
fn ready() -> bool {
    can_mount() && have_tool("python3") && have_tool("sha256sum")
}

/// A sandbox with the data spec (`big_mib`), data.lock `v1`, and runner A (straight to the
/// server, prefix `prefix`) that has filled the key and pushed it. Returns the sandbox, the
/// spec, A and A's push line's uploaded bytes.
fn pushed_by_a(w: &Weed, prefix: &str, big_mib: u32) -> (Sandbox, PathBuf, Runner, u64) {
    let (sb, spec, a, out) = filled_by_a(w, prefix, &data_spec(big_mib));
    (sb, spec, a, pushed_bytes(&out))
}

/// A sandbox with the spec `text`, data.lock `v1`, and runner A (straight to the server,
/// prefix `prefix`) that has filled the key and pushed it. Returns the sandbox, the spec, A
/// and A's run.
fn filled_by_a(w: &Weed, prefix: &str, text: &str) -> (Sandbox, PathBuf, Runner, Output) {
    let sb = Sandbox::new();
    let spec = sb.write_spec("spec.toml", text);
    std::fs::write(sb.work().join("data.lock"), "v1").unwrap();
    let a = Runner::new(w, sb.path("store-a"), prefix, "");
    let out = a.run(&sb, &spec, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    (sb, spec, a, out)
}

/// The uploaded bytes of a run's push line ("… N of M object(s) uploaded (B bytes) in T ms").
fn pushed_bytes(o: &Output) -> u64 {
    let e = stderr(o);
    let line = e
        .lines()
        .find(|l| l.contains("pushed key"))
        .unwrap_or_else(|| panic!("no push line in:\n{e}"));
    let b = line.rsplit_once(" bytes)").unwrap().0;
    b.rsplit_once('(').unwrap().1.parse().unwrap()
}

/// `<store>/v1/projects/lazy`.
fn project_dir(r: &Runner) -> PathBuf {
    r.store.join("v1/projects").join(PROJECT)
}

/// The tree of the one layer published in `r`'s store.
fn only_layer(r: &Runner) -> PathBuf {
    let layers: Vec<PathBuf> = std::fs::read_dir(project_dir(r).join("layers"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert_eq!(layers.len(), 1, "{layers:?}");
    layers[0].clone()
}

/// The id of the one layer published in `r`'s store.
fn only_layer_id(r: &Runner) -> String {
    let layer = only_layer(r);
    layer.file_name().unwrap().to_str().unwrap().to_string()
}

/// The line of `o`'s stderr starting with `prefix`.
fn line_of(o: &Output, prefix: &str) -> String {
    let e = stderr(o);
    e.lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting {prefix:?} in:\n{e}"))
        .to_string()
}

/// COMMAND's own output of a run without `--json` (stdout is COMMAND's).
fn out(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// sha256 of a file, hex.
fn sha256(p: &Path) -> String {
    let o = run_ok(Command::new("sha256sum").arg(p));
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// A shell loop (for COMMAND) that waits until the run's lazy-report.json says the layer is
/// complete (at most 120 s; the test then fails on what the run says).
fn wait_complete(r: &Runner) -> String {
    format!(
        "for i in $(seq 1200); do grep -qs '\"complete\":true' {}/runs/*/lazy-report.json && \
         break; sleep 0.1; done",
        project_dir(r).display()
    )
}

/// A shell snippet (for COMMAND) that prints the run's lazy-report.json once the daemon has
/// rewritten it after this point (it does every second; at most 30 s).
fn fresh_report(r: &Runner, mark: &Path) -> String {
    format!(
        "touch {m}; sleep 0.01; for i in $(seq 300); do for f in {runs}/runs/*/lazy-report.json; \
         do [ $f -nt {m} ] && cat $f && break 2; done; sleep 0.1; done",
        m = mark.display(),
        runs = project_dir(r).display()
    )
}

/// A run of `r` (no `--json`) with COMMAND `command` and stdin closed, under
/// [`output_within`]'s `limit`: its output and how long it took.
fn run_within(
    r: &Runner,
    (sb, spec): (&Sandbox, &Path),
    command: &[&str],
    limit: Duration,
    what: &str,
) -> (Output, Duration) {
    let args = r.run_args(false, sb, spec, command);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut cmd = r.command(&args);
    cmd.stdin(Stdio::null());
    output_within(cmd, limit, what)
}

/// Runs `cmd` (stdout/stderr captured) and returns its output and how long it took; SIGKILLs
/// it and panics when it has not ended within `limit` (a hang).
fn output_within(mut cmd: Command, limit: Duration, what: &str) -> (Output, Duration) {
    let t0 = Instant::now();
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(o) => {
            let o = o.unwrap();
            eprintln!("{what}: {:?}: {}", t0.elapsed(), show(&o));
            (o, t0.elapsed())
        }
        Err(_) => {
            // SAFETY: kill(2) on the pid of our own child (its waiter thread reaps it).
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("{what}: still running after {limit:?} (a hang)");
        }
    }
}

/// One entry of a layer's tree, as compared between stores.
#[derive(Debug, PartialEq, Eq)]
struct Entry {
    /// 'd', 'f', 'l' or '?'.
    kind: char,
    /// Permission bits.
    perm: u32,
    size: u64,
    /// A symlink's target.
    target: Option<PathBuf>,
    /// A file's blake3.
    hash: Option<String>,
    /// `user.*` xattrs.
    xattrs: BTreeMap<String, Vec<u8>>,
}

/// Every entry below `root` by relative path (the root itself as "").
fn tree_of(root: &Path) -> BTreeMap<String, Entry> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let m = std::fs::symlink_metadata(&p).unwrap();
        let ft = m.file_type();
        let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
        let kind = match () {
            _ if ft.is_dir() => 'd',
            _ if ft.is_file() => 'f',
            _ if ft.is_symlink() => 'l',
            _ => '?',
        };
        if ft.is_dir() {
            for e in std::fs::read_dir(&p).unwrap() {
                stack.push(e.unwrap().path());
            }
        }
        out.insert(
            rel,
            Entry {
                kind,
                perm: m.permissions().mode() & 0o7777,
                size: if ft.is_dir() { 0 } else { m.len() },
                target: ft.is_symlink().then(|| std::fs::read_link(&p).unwrap()),
                hash: ft.is_file().then(|| {
                    blake3::hash(&std::fs::read(&p).unwrap())
                        .to_hex()
                        .to_string()
                }),
                xattrs: user_xattrs(&p),
            },
        );
    }
    out
}

/// The `user.*` xattrs of `p` (not following a symlink).
fn user_xattrs(p: &Path) -> BTreeMap<String, Vec<u8>> {
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    let mut names = vec![0u8; 4096];
    // SAFETY: a NUL-terminated path and a buffer of the length given.
    let n = unsafe { libc::llistxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    if n <= 0 {
        return BTreeMap::new();
    }
    names.truncate(n as usize);
    let mut out = BTreeMap::new();
    for name in names.split(|&b| b == 0).filter(|n| n.starts_with(b"user.")) {
        let cn = std::ffi::CString::new(name).unwrap();
        let mut v = vec![0u8; 4096];
        // SAFETY: NUL-terminated path and name, a buffer of the length given.
        let len =
            unsafe { libc::lgetxattr(c.as_ptr(), cn.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
        assert!(len >= 0, "lgetxattr {p:?} {cn:?}");
        v.truncate(len as usize);
        out.insert(String::from_utf8_lossy(name).into_owned(), v);
    }
    out
}

/// A layer's recorded link groups (`<layer>/links`: paths NUL-separated, groups ended by an
/// extra NUL), each sorted, sorted.
fn link_groups(layer: &Path) -> Vec<Vec<String>> {
    let bytes = std::fs::read(layer.join("links")).unwrap_or_default();
    let text = String::from_utf8_lossy(&bytes);
    let mut groups: Vec<Vec<String>> = text
        .split("\0\0")
        .filter(|g| !g.is_empty())
        .map(|g| {
            let mut v: Vec<String> = g
                .split('\0')
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect();
            v.sort();
            v
        })
        .collect();
    groups.sort();
    groups
}

/// Files below `dir` whose bytes do not hash to the id their name starts with (a store's
/// `objects/<aa>/<hex>-<tag>` or a partial layer's `held/<hex>`); temporary files (a leading
/// `.`) are not objects and are skipped. Returns (checked, bad).
fn misnamed_objects(dir: &Path) -> (usize, Vec<PathBuf>) {
    let (mut checked, mut bad) = (0, Vec::new());
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                stack.push(p);
            } else if ft.is_file() && !name.starts_with('.') && name.len() >= 64 {
                checked += 1;
                let h = blake3::hash(&std::fs::read(&p).unwrap()).to_hex();
                if h.as_str() != &name[..64] {
                    bad.push(p);
                }
            }
        }
    }
    (checked, bad)
}

/// `verify --json` of `r`'s store finds nothing wrong; every held/ link of a partial layer is
/// its object's bytes too.
fn assert_store_verifies(r: &Runner) {
    let v = r.lc(&["--json", "verify"]);
    assert!(v.status.success());
    let rep: serde_json::Value = serde_json::from_slice(&v.stdout).unwrap();
    assert!(
        rep["bad_objects"].as_array().unwrap().is_empty()
            && rep["quarantined"].as_array().unwrap().is_empty(),
        "{rep}"
    );
    let (_, bad) = misnamed_objects(&project_dir(r).join("objects"));
    assert!(bad.is_empty(), "objects not matching their name: {bad:?}");
    let (_, bad) = misnamed_objects(&project_dir(r).join("partial"));
    assert!(
        bad.is_empty(),
        "held objects not matching their name: {bad:?}"
    );
}

/// An empty store B reaches the server through the link: its run is a hit at once, mounted
/// lazily (the summary line and the event say so), COMMAND reads files, a symlink, a big
/// file, the hardlink pair and an xattr correctly; background completion fetches the rest and
/// the layer is published locally: `verify` is clean, B's next run is a local hit that asks no
/// remote, and B's layer tree is A's (paths, types, modes, sizes, symlink targets, bytes,
/// xattrs, link groups). The manifest carries no trace: the key was pushed by a runner that
/// never ran it lazily (an old key's case).
#[test]
fn lazy_hit_reads_at_once_then_completes_into_the_layer_a_pushed() {
    if !ready() {
        return;
    }
    let Some(w) = Weed::start() else { return };
    let Some(link) = LinkProxy::start(w.endpoint(), 0.0, 0) else {
        return;
    };
    let (sb, spec, a, up_bytes) = pushed_by_a(&w, "hit", 6);
    let a_layer = only_layer(&a);
    let big = sha256(&a_layer.join("tree/big.bin"));
    let b = Runner::via(&w, &link.endpoint(), sb.path("store-b"), "hit", "");

    let script = format!(
        "set -e; cat $DATA/a/s1.txt $DATA/link; sha256sum < $DATA/big.bin; \
         stat -c '%i %h' $DATA/c/h1 $DATA/c/h2 $DATA/c/same; \
         python3 -c 'import os, sys; print(os.getxattr(sys.argv[1], \"user.note\").decode())' \
         $DATA/a/s1.txt; $DATA/c/run.sh; {}",
        wait_complete(&b)
    );
    let rb = b.run_as(false, &sb, &spec, &["sh", "-c", &script]);
    assert_eq!(rb.status.code(), Some(0), "{}", show(&rb));
    let said: Vec<String> = out(&rb).lines().map(String::from).collect();
    assert_eq!(said[..2], ["small 1", "deep"], "{said:?}");
    assert_eq!(said[2], format!("{big}  -"), "big.bin's bytes");
    let ino = |l: &str| -> (String, String) {
        let (i, n) = l.split_once(' ').unwrap();
        (i.to_string(), n.to_string())
    };
    let (h1, h2, same) = (ino(&said[3]), ino(&said[4]), ino(&said[5]));
    assert_eq!(h1, h2, "the hardlink pair is one inode");
    assert_eq!(h1.1, "2");
    assert!(same.0 != h1.0 && same.1 == "1", "{said:?}");
    assert_eq!(said[6..], ["hello", "hi"], "{said:?}");

    let summary = line_of(&rb, "layercache: data ");
    assert!(
        summary.starts_with("layercache: data hit in ")
            && summary.contains("(mounted lazily from the remote: ")
            && summary.ends_with(" to fetch on first read)"),
        "{summary}"
    );
    let e = &b.events()[0];
    assert_eq!(
        (
            &e["result"],
            &e["remote_hit"],
            &e["remote_lazy"],
            &e["setup_ms"]
        ),
        (&"hit".into(), &true.into(), &true.into(), &0.into()),
        "{e}"
    );
    assert_eq!(
        e["lazy_bytes"].as_u64(),
        Some(up_bytes),
        "nothing was local: {e}"
    );
    let done = line_of(&rb, "layercache: data: fetched lazily ");
    assert!(
        done.contains("the layer is complete and now local"),
        "{done}"
    );
    // The content came as ranged reads of the pack and of the big object (6 MiB, served piece
    // by piece): every piece once, in ranged GETs of at most 8 MiB (a reader's read-ahead).
    let log = link.log();
    let gets = |what: &str| {
        log.iter()
            .filter(|r| r["method"] == "GET" && r["path"].as_str().unwrap().contains(what))
            .count()
    };
    assert!(
        log.iter().any(|r| r["method"] == "GET"
            && r["path"].as_str().unwrap().contains("/packs/")
            && r["range"].is_string()),
        "no ranged pack read: {log:?}"
    );
    assert!(gets("/objects/") >= 2, "{log:?}");
    let object_bytes: u64 = (log.iter())
        .filter(|r| r["method"] == "GET" && r["path"].as_str().unwrap().contains("/objects/"))
        .map(|r| r["bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(object_bytes, 6 << 20, "each piece once: {log:?}");
    // Before the mount only the tree manifest came; the daemon fetched the compact form
    // (the object table) after it, and the publish read it again; the JSON one was never read.
    let manifests: Vec<&str> = (log.iter())
        .map(|r| r["path"].as_str().unwrap())
        .filter(|p| p.contains("/manifests/"))
        .map(|p| p.rsplit('.').next().unwrap())
        .collect();
    assert!(
        manifests.len() >= 2 && manifests[0] == "tree" && manifests[1] == "compact",
        "{manifests:?}"
    );
    assert!(!manifests.contains(&"json"), "{manifests:?}");
    assert!(
        log.iter()
            .filter(|r| r["path"].as_str().unwrap().contains("/objects/"))
            .all(|r| r["range"].is_string() && r["bytes"].as_u64() <= Some(8 << 20)),
        "{log:?}"
    );

    assert_store_verifies(&b);
    // What the run fetched (all of it: the run waited for the layer to complete) is logged at
    // its end, as an event of the cache's preparation, and counted by `stats`.
    let fetched = b.lazy_fetch_events();
    assert_eq!(fetched.len(), 1, "{fetched:?}");
    assert_eq!(
        (
            &fetched[0]["cache"],
            &fetched[0]["run"],
            &fetched[0]["result"]
        ),
        (&e["cache"], &e["run"], &e["result"]),
        "{}",
        fetched[0]
    );
    assert_eq!(
        fetched[0]["pulled_bytes"].as_u64(),
        Some(up_bytes),
        "{}",
        fetched[0]
    );
    let stats = b.lc(&["--json", "stats"]);
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    assert_eq!(
        (stats["remote_hits"].as_u64(), stats["lazy_bytes"].as_u64()),
        (Some(1), Some(up_bytes)),
        "{stats}"
    );
    let b_layer = only_layer(&b);
    assert_eq!(
        b_layer.file_name(),
        a_layer.file_name(),
        "the layer keeps its id"
    );
    let (ta, tb) = (
        tree_of(&a_layer.join("tree")),
        tree_of(&b_layer.join("tree")),
    );
    assert_eq!(ta.len(), tb.len(), "{:?}\n{:?}", ta.keys(), tb.keys());
    for (p, ea) in &ta {
        assert_eq!(Some(ea), tb.get(p), "{p}");
    }
    assert_eq!(
        ta["a/s1.txt"].xattrs["user.note"], b"hello",
        "the xattr travels"
    );
    assert_eq!(ta["a/s5.txt"].perm, 0o600);
    assert_eq!(link_groups(&b_layer), [["c/h1", "c/h2"]]);
    assert_eq!(link_groups(&a_layer), link_groups(&b_layer));
    // What the lazy mount kept (its partial directory) is garbage once the layer is published.
    let partial = project_dir(&b)
        .join("partial")
        .join(b_layer.file_name().unwrap());
    assert!(b.lc(&["gc"]).status.success());
    assert!(!partial.exists(), "gc left {}", partial.display());

    // Now local: a hit that asks the remote nothing.
    let requests = link.log().len();
    let again = b.run_as(false, &sb, &spec, &["cat", "/dev/null"]);
    assert_eq!(again.status.code(), Some(0));
    let local = line_of(&again, "layercache: data ");
    assert!(
        local.starts_with("layercache: data hit in ") && !local.contains("remote"),
        "{local}"
    );
    assert_eq!(b.events()[1]["remote_hit"], false);
    assert!(!stderr(&again).contains("lazily"), "{}", stderr(&again));
    assert_eq!(link.log().len(), requests, "a local hit sent requests");
    assert!(sb.mounts_below().is_empty());
}

/// A lazily mounted layer is served from its manifest: `ls -lR` and `find -printf` of every
/// entry's type, mode, size, links, owner, mtime and symlink target through B's lazy mount
/// show exactly what a local hit on A shows, and the daemon's report says no file was opened
/// (background completion still fetches: that is not what a reader waits for).
/// Writing into a lazily mounted layer copies up from it like from a local one: an append to a
/// lower file keeps its bytes and its `user.*` xattr (which the manifest holds, not the fetched
/// bytes), a new file in a lower directory (that directory copied up), a chmod of the stored-alone
/// big file; the run's view shows it all and the layer itself is unchanged when it completes.
#[test]
fn writes_to_a_lazy_layer_copy_up_as_from_a_local_one() {
    if !ready() {
        return;
    }
    let Some(w) = Weed::start() else { return };
    let (sb, spec, a, _) = pushed_by_a(&w, "write", 6);
    let b = Runner::new(&w, sb.path("store-b"), "write", "");
    let script = "set -e; echo more >> $DATA/a/s1.txt; cat $DATA/a/s1.txt; \
         python3 -c 'import os, sys; print(os.getxattr(sys.argv[1], \"user.note\").decode())' \
           $DATA/a/s1.txt; \
         mkdir $DATA/a/b/new; echo x > $DATA/a/b/new/y; echo z > $DATA/c/added; \
         chmod 700 $DATA/big.bin; stat -c %a $DATA/big.bin; ls $DATA/a/b";
    let script = format!("{script}; {}", wait_complete(&b));
    let rb = b.run(&sb, &spec, &["sh", "-c", &script]);
    assert_eq!(rb.status.code(), Some(0), "{}", show(&rb));
    // (stdout: the `--json` summary line, then COMMAND's output)
    assert!(
        out(&rb).ends_with("\nsmall 1\nmore\nhello\n700\ndeep.txt\nnew\n"),
        "{}",
        out(&rb)
    );
    assert_eq!(b.events()[0]["remote_lazy"], true, "{}", b.events()[0]);
    // The writes went to the run's upper only: the layer B completes is A's.
    let done = line_of(&rb, "layercache: data: fetched lazily ");
    assert!(
        done.contains("the layer is complete and now local"),
        "{done}"
    );
    let (ta, tb) = (
        tree_of(&only_layer(&a).join("tree")),
        tree_of(&only_layer(&b).join("tree")),
    );
    assert_eq!(ta, tb);
    assert_store_verifies(&b);
    assert!(sb.mounts_below().is_empty());
}

#[test]
fn listing_a_lazy_layer_opens_no_file() {
    if !ready() {
        return;
    }
    let Some(w) = Weed::start() else { return };
    let Some(link) = LinkProxy::start(w.endpoint(), 0.0, 0) else {
        return;
    };
    let (sb, spec, a, _) = pushed_by_a(&w, "ls", 6);
    let b = Runner::via(&w, &link.endpoint(), sb.path("store-b"), "ls", "")
        .with_env("LAYERCACHE_LAZY", "1");
    // (Not the root: the mount's root is the run's own directory, made at mount time.)
    let find = "cd $DATA && ls -lR . > /dev/null && find . -mindepth 1 -printf \
                '%p|%y|%m|%s|%n|%U|%G|%T@|%l\\n' | sort";

    let ra = a.run_as(false, &sb, &spec, &["sh", "-c", find]);
    assert_eq!(ra.status.code(), Some(0));
    assert_eq!(a.events()[1]["result"], "hit");
    let listed = out(&ra);
    assert_eq!(listed.lines().count(), 18, "{listed}");

    let mark = sb.path("mark");
    let script = format!("{find}; echo REPORT; {}", fresh_report(&b, &mark));
    let rb = b.run_as(false, &sb, &spec, &["sh", "-c", &script]);
    assert_eq!(rb.status.code(), Some(0));
    assert_eq!(b.events()[0]["remote_lazy"], true);
    let text = out(&rb);
    let (lazy_listing, report) = text.split_once("REPORT\n").unwrap();
    assert_eq!(lazy_listing, listed, "the lazy mount's metadata");
    let report: serde_json::Value = serde_json::from_str(report.trim())
        .unwrap_or_else(|e| panic!("no report ({e}): {report:?}"));
    assert_eq!(report["opened"], 0, "{report}");
    // `ls -lR` as a user runs it.
    let ls = b.run_as(false, &sb, &spec, &["sh", "-c", "ls -lR $DATA"]);
    assert_eq!(ls.status.code(), Some(0));
    let ls = out(&ls);
    for name in [
        "s1.txt", "deep.txt", "z.txt", "run.sh", "h1", "h2", "same", "empty", "big.bin",
    ] {
        assert!(ls.contains(name), "{name} not listed: {ls}");
    }
    assert!(ls.contains("link -> a/b/deep.txt"), "{ls}");
    assert!(sb.mounts_below().is_empty());
}

/// Reading a lazily mounted layer's files changes none of their attributes: after every file
/// was read (and with one still open), `find -printf` of type, mode, size, links, owner, mtime
/// and symlink target through a fresh runner's lazy mount shows exactly what a local hit on A
/// shows. (A lazily fetched file's bytes sit in a store object whose own mode and times are not
/// the file's: a GETATTR answered from it once made `cargo build` on a lazy target dir see
/// every dependency changed and rebuild them all, reading every rlib.)
#[test]
fn reading_a_lazy_layer_keeps_the_attributes_a_local_hit_shows() {
    if !ready() {
        return;
    }
    let Some(w) = Weed::start() else { return };
    let Some(link) = LinkProxy::start(w.endpoint(), 0.0, 0) else {
        return;
    };
    let (sb, spec, a, _) = pushed_by_a(&w, "attrs", 6);
    let b = Runner::via(&w, &link.endpoint(), sb.path("store-b"), "attrs", "")
        .with_env("LAYERCACHE_LAZY", "1");
    let find = "cd $DATA && find . -mindepth 1 -printf '%p|%y|%m|%s|%n|%U|%G|%T@|%l\\n' | sort";
    let ra = a.run_as(false, &sb, &spec, &["sh", "-c", find]);
    assert_eq!(ra.status.code(), Some(0));
    let listed = out(&ra);
    assert_eq!(listed.lines().count(), 18, "{listed}");

    let script = format!(
        "set -e; find $DATA -type f -exec cat {{}} + > /dev/null; exec 3< $DATA/a/s1.txt; {find}"
    );
    let rb = b.run_as(false, &sb, &spec, &["sh", "-c", &script]);
    assert_eq!(rb.status.code(), Some(0), "{}", show(&rb));
    assert_eq!(b.events()[0]["remote_lazy"], true);
    assert_eq!(
        out(&rb),
        listed,
        "the lazy mount's metadata after reading every file"
    );
    assert!(sb.mounts_below().is_empty());
}

/// An empty file whose pack neighbours are local already or too big to share its window is
/// fetched alone: a pack range of no bytes (no GET at all). Its read must not hang: in a
/// layer of two 600 KiB files around an empty one (`d/a.bin`, `d/b`, `d/c.bin`, one pack, in
/// that order), reading `d/c.bin` and then `d/a.bin` (whose read-ahead is `d/b` alone) and then
/// `d/b` succeeds at once, the run ends and the layer completes.
#[test]
fn an_empty_file_fetched_alone_is_read() {
    if !ready() {
        return;
    }
    let Some(w) = Weed::start() else { return };
    let Some(link) = LinkProxy::start(w.endpoint(), 0.0, 0) else {
        return;
    };
    let (sb, spec, _a, _) = filled_by_a(
        &w,
        "empty",
        &spec_with_setup(
            r#"mkdir -p $DATA/d
head -c 600K /dev/urandom > $DATA/d/a.bin
: > $DATA/d/b
head -c 600K /dev/urandom > $DATA/d/c.bin"#,
        ),
    );
    let b = Runner::via(&w, &link.endpoint(), sb.path("store-b"), "empty", "")
        .with_env("LAYERCACHE_LAZY", "1");
    let script = format!(
        "set -e; cat $DATA/d/c.bin $DATA/d/a.bin > /dev/null; timeout 20 cat $DATA/d/b; \
         echo read; {}",
        wait_complete(&b)
    );
    let cmd = ["sh", "-c", &script];
    let (rb, took) = run_within(
        &b,
        (&sb, &spec),
        &cmd,
        Duration::from_secs(120),
        "the lazy run",
    );
    assert_eq!(rb.status.code(), Some(0), "{}", show(&rb));
    assert_eq!(b.events()[0]["remote_lazy"], true);
    assert!(
        out(&rb).starts_with("read\n"),
        "{} after {took:?}",
        show(&rb)
    );
    assert_store_verifies(&b);
    assert!(sb.mounts_below().is_empty());
}

/// B's lazy run records the order in which it first opened the layer's files and stores it
/// beside the key in the remote (`caches/<cache>/traces/<key>`); a third empty store C's lazy
/// run gets that trace as its partial layer's `replay`, in order; C's run (which opens no
/// file of the layer) leaves the stored trace as it was.
#[test]
fn a_lazy_run_stores_its_trace_and_the_next_fresh_runner_replays_it() {
    use object_store::ObjectStoreExt;
    if !ready() {
        return;
    }
    let Some(w) = Weed::start() else { return };
    let Some(link) = LinkProxy::start(w.endpoint(), 0.0, 0) else {
        return;
    };
    let (sb, spec, _a, _) = pushed_by_a(&w, "trace", 6);
    let b = Runner::via(&w, &link.endpoint(), sb.path("store-b"), "trace", "");
    let c = Runner::via(&w, &link.endpoint(), sb.path("store-c"), "trace", "");
    let order = ["c/z.txt", "a/b/deep.txt", "big.bin", "a/s3.txt"];
    let cat: Vec<String> = order.iter().map(|p| format!("$DATA/{p}")).collect();
    let script = format!("cat {} $DATA/c/z.txt > /dev/null", cat.join(" "));
    let rb = b.run_as(false, &sb, &spec, &["sh", "-c", &script]);
    assert_eq!(rb.status.code(), Some(0));
    let key = b.events()[0]["key"].as_str().unwrap().to_string();
    let want: String = order.iter().map(|p| format!("{p}\n")).collect();

    let path = object_store::path::Path::from(format!(
        "trace/v1/projects/{PROJECT}/caches/data/traces/{key}"
    ));
    let (rt, client) = (runtime(), s3(&w));
    let stored = |rt: &tokio::runtime::Runtime| {
        rt.block_on(async { client.get(&path).await.unwrap().bytes().await.unwrap() })
    };
    assert_eq!(
        String::from_utf8_lossy(&stored(&rt)),
        want,
        "the stored trace"
    );

    let replay = format!("cat {}/partial/*/replay", project_dir(&c).display());
    let rc = c.run_as(false, &sb, &spec, &["sh", "-c", &replay]);
    assert_eq!(rc.status.code(), Some(0));
    assert_eq!(c.events()[0]["remote_lazy"], true);
    assert_eq!(out(&rc), want, "C's replay");
    assert_eq!(
        String::from_utf8_lossy(&stored(&rt)),
        want,
        "C kept B's trace"
    );
    assert!(sb.mounts_below().is_empty());
}

/// Files likely to be mmapped come before COMMAND: runner B's run opens four 600 KiB files,
/// a 300 KiB file and then `lib/libx.so.1` (300 KiB); a fresh runner C (over a 20 Mbit/s link
/// with 30 ms per response, a budget of 10 s so a loaded machine does not make it flaky) has
/// the `.so`'s object in its partial layer's `held/` when COMMAND starts, before COMMAND reads
/// anything: its daemon fetched it first, alone (its report says one object of 300 KiB; the
/// trace replay, which brings the other five, waited), and the run waited for that. Before,
/// the replay's units all shared the link and the `.so`, traced last, came ~1 s later.
#[test]
fn a_fresh_runner_has_the_traced_mmapped_files_before_command_starts() {
    if !ready() {
        return;
    }
    let Some(w) = Weed::start() else { return };
    let Some(link) = LinkProxy::start(w.endpoint(), 20.0, 30) else {
        return;
    };
    let (sb, spec, a, _) = filled_by_a(
        &w,
        "mmap",
        &spec_with_setup(
            r#"mkdir -p $DATA/d $DATA/lib $DATA/s
for i in 1 2 3 4; do head -c 600K /dev/urandom > $DATA/d/a$i.bin; done
head -c 300K /dev/urandom > $DATA/d/plain.bin
head -c 300K /dev/urandom > $DATA/lib/libx.so.1
for i in 1 2 3; do echo "small $i" > $DATA/s/f$i; done"#,
        ),
    );
    let tree = only_layer(&a).join("tree");
    let id = |rel: &str| blake3::hash(&std::fs::read(tree.join(rel)).unwrap()).to_hex();
    let (so, plain) = (id("lib/libx.so.1"), id("d/plain.bin"));

    let b = Runner::via(&w, &link.endpoint(), sb.path("store-b"), "mmap", "");
    let files = "$DATA/d/a1.bin $DATA/d/a2.bin $DATA/d/a3.bin $DATA/d/a4.bin $DATA/d/plain.bin \
                 $DATA/lib/libx.so.1";
    let rb = b.run_as(
        false,
        &sb,
        &spec,
        &["sh", "-c", &format!("cat {files} > /dev/null")],
    );
    assert_eq!(rb.status.code(), Some(0), "{}", show(&rb));

    let c = Runner::via(&w, &link.endpoint(), sb.path("store-c"), "mmap", "")
        .with_env("LAYERCACHE_LAZY_PREFETCH", "10s");
    let script = format!(
        "ls {p}/partial/*/held/; echo --; cat {p}/runs/*/lazy-prefetched.json; echo; echo --; \
         sha256sum < $DATA/lib/libx.so.1",
        p = project_dir(&c).display()
    );
    let rc = c.run_as(false, &sb, &spec, &["sh", "-c", &script]);
    assert_eq!(rc.status.code(), Some(0), "{}", show(&rc));
    assert_eq!(c.events()[0]["remote_lazy"], true);
    let said = out(&rc);
    let mut parts = said.split("--\n");
    let held: Vec<&str> = parts.next().unwrap().lines().collect();
    assert!(
        held.contains(&so.as_str()),
        "the .so's object {so} is not held when COMMAND starts: {held:?}\n{}",
        show(&rc)
    );
    let report: serde_json::Value = serde_json::from_str(parts.next().unwrap().trim()).unwrap();
    assert_eq!(
        (&report["objects"], &report["bytes"], &report["skipped"]),
        (&1.into(), &(300u64 << 10).into(), &serde_json::Value::Null),
        "only the .so came first: {report} (d/plain.bin is {plain})"
    );
    assert_eq!(
        parts.next().unwrap().trim(),
        format!("{}  -", sha256(&tree.join("lib/libx.so.1")))
    );
    let done = line_of(&rc, "layercache: data: fetched lazily ");
    assert!(
        done.contains("; 300.0 KiB of 1 likely-mmapped file(s) before COMMAND)"),
        "{done}"
    );
    assert_store_verifies(&c);
    assert!(sb.mounts_below().is_empty());
}

/// The untraced files a trace replay brings along (the neighbours between traced files in the
/// pack, one GET with them) wait in memory for a quiet moment before they are stored; a run
/// that ends first stores them as its daemon exits, so the next run has them and fetches
/// nothing again. Runner B reads every tenth of 200 small files and the last (its trace);
/// runner C, fresh, replays it, reads the same files and ends at once (well before the 1.5 s quiet):
/// every one of the 200 is in C's partial layer afterwards.
#[test]
fn a_run_that_ends_before_it_is_quiet_keeps_what_the_trace_replay_brought() {
    if !ready() {
        return;
    }
    let Some(w) = Weed::start() else { return };
    let Some(link) = LinkProxy::start(w.endpoint(), 0.0, 0) else {
        return;
    };
    let (sb, spec, _a, _) = filled_by_a(
        &w,
        "held",
        &spec_with_setup(
            r#"for i in $(seq 100 299); do head -c 1000 /dev/urandom > $DATA/f$i; done"#,
        ),
    );
    let read_tenth = [
        "sh",
        "-c",
        "cat $DATA/f1?0 $DATA/f2?0 $DATA/f299 > /dev/null",
    ];
    let b = Runner::via(&w, &link.endpoint(), sb.path("store-b"), "held", "");
    let rb = b.run_as(false, &sb, &spec, &read_tenth);
    assert_eq!(rb.status.code(), Some(0), "{}", show(&rb));

    let c = Runner::via(&w, &link.endpoint(), sb.path("store-c"), "held", "");
    let rc = c.run_as(false, &sb, &spec, &read_tenth);
    assert_eq!(rc.status.code(), Some(0), "{}", show(&rc));
    assert_eq!(c.events()[0]["remote_lazy"], true);
    // Complete already (published) is fine too: nothing was dropped.
    let published = project_dir(&c).join("layers");
    if published.read_dir().is_ok_and(|mut d| d.next().is_some()) {
        assert_eq!(only_layer(&c).join("tree").read_dir().unwrap().count(), 200);
    } else {
        let held = std::fs::read_dir(project_dir(&c).join("partial"))
            .unwrap()
            .flatten()
            .map(|l| std::fs::read_dir(l.path().join("held")).map_or(0, |d| d.count()))
            .sum::<usize>();
        assert_eq!(held, 200, "objects held after the run: {}", show(&rc));
    }
    assert_store_verifies(&c);
    assert!(sb.mounts_below().is_empty());
}

/// Every thread of a lazy layer's daemon blocks SIGUSR1, the signal `umount` sends a daemon
/// that has not exited 200 ms after its mount went: its runtime's threads start before the
/// daemon's signal thread, and one that did not block it would take it with its default
/// action, killing the process in the middle of its exit (storing what the trace replay
/// brought, writing its report). Read from /proc while the run's COMMAND sleeps.
#[test]
fn a_lazy_daemons_threads_leave_the_exit_signal_to_its_signal_thread() {
    if !ready() {
        return;
    }
    let Some(w) = Weed::start() else { return };
    let (sb, spec, _a, _) = pushed_by_a(&w, "sigmask", 1);
    let c = Runner::new(&w, sb.path("store-c"), "sigmask", "");
    let args = c.run_args(
        false,
        &sb,
        &spec,
        &["sh", "-c", "cat $DATA/a/s1.txt; sleep 5"],
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let child = c
        .command(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The daemon's pid, from the run's record once the mount is up.
    let runs = project_dir(&c).join("runs");
    let t0 = Instant::now();
    let pid = loop {
        let found = (std::fs::read_dir(&runs).into_iter().flatten().flatten())
            .filter_map(|e| std::fs::read(e.path().join("run.json")).ok())
            .filter_map(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .find_map(|r| r["daemon_pid"].as_u64().filter(|&p| p != 0));
        if let Some(p) = found {
            break p;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no daemon pid in {runs:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    std::thread::sleep(Duration::from_millis(500));
    let mut threads = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
        let field = |k: &str| {
            (status.lines())
                .find_map(|l| l.strip_prefix(k))
                .map(|v| v.trim().to_string())
                .unwrap_or_default()
        };
        let blocked = u64::from_str_radix(&field("SigBlk:"), 16).unwrap_or(0);
        threads.push((field("Name:"), blocked & (1 << (libc::SIGUSR1 - 1)) != 0));
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    assert!(threads.len() > 2, "{threads:?}");
    // (The signal thread waits in sigtimedwait(2), which unblocks what it waits for.)
    let open: Vec<&String> = (threads.iter()).filter(|t| !t.1).map(|t| &t.0).collect();
    assert_eq!(open, ["signals"], "threads taking SIGUSR1, of {threads:?}");
    assert!(sb.mounts_below().is_empty());
}

/// The link is cut in the middle of a run (after a small file was read, before a big one has
/// arrived): with `LAYERCACHE_LAZY_TIMEOUT=3` the big file's read fails with EIO within 20 s,
/// the run ends (the link still down), no object in the store or held by the partial layer is
/// anything but its verified bytes, and a later run with the link up reads the file. A cut of
/// 1.5 s (default bound: 10 s without progress) is only a pause: the read succeeds; a cut of
/// 12 s with `LAYERCACHE_LAZY_TIMEOUT=30` outlasts the progress deadline (10 s): the fetch is
/// retried and the read succeeds. A link down when the run looks the key up means no lazy
/// mount: a local miss.
#[test]
fn a_link_cut_mid_read_fails_the_read_within_the_bound_and_a_short_one_is_survived() {
    if !ready() {
        return;
    }
    let Some(w) = Weed::start() else { return };
    // 32 MiB at 40 Mbit/s: over 6 s to arrive.
    let Some(link) = LinkProxy::start(w.endpoint(), 40.0, 5) else {
        return;
    };
    let (sb, spec, a, _) = pushed_by_a(&w, "cut", 32);
    let big = sha256(&only_layer(&a).join("tree/big.bin"));
    let control = link.control();
    let daemon_log = sb.path("daemon.log");
    let c = Runner::via(&w, &link.endpoint(), sb.path("store-c"), "cut", "")
        .with_env("LAYERCACHE_LAZY_TIMEOUT", "3")
        .with_env("LAYERCACHE_DAEMON_LOG", daemon_log.to_str().unwrap());

    // COMMAND reads a small file, cuts the link (the proxy polls its control file every
    // 100 ms), then reads the big file, timing the read.
    let script = format!(
        "cat $DATA/a/s1.txt; echo down > {ctl}; sleep 0.3; t0=$(date +%s%N); \
         if cat $DATA/big.bin > /dev/null 2> {err}; then echo READ-OK; else echo READ-FAILED; \
         fi; echo ms $(( ($(date +%s%N) - t0) / 1000000 ))",
        ctl = control.display(),
        err = sb.path("cat-err").display()
    );
    let (rc, took) = run_within(
        &c,
        (&sb, &spec),
        &["sh", "-c", &script],
        Duration::from_secs(180),
        "cut run",
    );
    let said = out(&rc);
    assert!(said.starts_with("small 1\nREAD-FAILED\n"), "{said}");
    let ms: u64 = said.rsplit_once("ms ").unwrap().1.trim().parse().unwrap();
    assert!(ms < 20_000, "the read failed after {ms} ms");
    let err = std::fs::read_to_string(sb.path("cat-err")).unwrap();
    assert!(err.contains("Input/output error"), "{err}");
    assert_eq!(c.events()[0]["remote_lazy"], true);
    eprintln!("LAZY cut: EIO after {ms} ms; the run ended after {took:?} with the link down");
    let e = stderr(&rc);
    assert!(
        e.contains("the next run fetches the rest"),
        "the run says the layer is incomplete: {e}"
    );
    // The daemon's log names the file and the remote's failure.
    let logged = std::fs::read_to_string(&daemon_log).unwrap_or_default();
    let failed = logged
        .lines()
        .find(|l| l.contains("big.bin"))
        .unwrap_or_else(|| panic!("the daemon's log does not name big.bin:\n{logged}"));
    assert!(failed.contains("no answer within 1 s"), "{failed}");
    assert_store_verifies(&c);
    let ls = c.lc(&["ls"]);
    assert!(
        String::from_utf8_lossy(&ls.stdout).contains("mounted lazily: "),
        "ls shows the partial layer: {}",
        show(&ls)
    );
    assert!(sb.mounts_below().is_empty());

    // The link is back: the next run reads it (resuming from what is local: the manifests
    // the first run kept are not fetched again).
    link.up();
    let manifest_gets = || {
        (link.log().iter())
            .filter(|r| r["method"] == "GET" && r["path"].as_str().unwrap().contains("/manifests/"))
            .count()
    };
    let before = manifest_gets();
    let sum = ["sh", "-c", "sha256sum < $DATA/big.bin"];
    let (again, _) = run_within(
        &c,
        (&sb, &spec),
        &sum,
        Duration::from_secs(180),
        "run after",
    );
    assert_eq!(again.status.code(), Some(0));
    assert_eq!(out(&again), format!("{big}  -\n"));
    assert_eq!(c.events()[1]["remote_lazy"], true);
    // (Publishing the completed layer reads the manifest once more: a pull's own check.)
    assert!(manifest_gets() <= before + 1, "{:?}", link.log());
    assert_store_verifies(&c);

    // A 1.5 s cut as the read starts: a pause, not a failure (default bound).
    let d = Runner::via(&w, &link.endpoint(), sb.path("store-d"), "cut", "");
    let blip = |secs: &str| {
        format!(
            "echo down > {ctl}; (sleep {secs}; echo up > {ctl}) & sha256sum < $DATA/big.bin; wait",
            ctl = control.display()
        )
    };
    let script = blip("1.5");
    let (rd, _) = run_within(
        &d,
        (&sb, &spec),
        &["sh", "-c", &script],
        Duration::from_secs(180),
        "blip run",
    );
    assert_eq!(rd.status.code(), Some(0));
    assert_eq!(out(&rd), format!("{big}  -\n"));
    assert_store_verifies(&d);

    // A 12 s cut with a 30 s bound: the 10 s progress deadline passes, the fetch is retried.
    let e = Runner::via(&w, &link.endpoint(), sb.path("store-e"), "cut", "")
        .with_env("LAYERCACHE_LAZY_TIMEOUT", "30");
    let script = blip("12");
    let (re, took) = run_within(
        &e,
        (&sb, &spec),
        &["sh", "-c", &script],
        Duration::from_secs(240),
        "long cut run",
    );
    assert_eq!(re.status.code(), Some(0), "{}", show(&re));
    assert_eq!(out(&re), format!("{big}  -\n"));
    eprintln!("LAZY 12 s cut survived; the run took {took:?}");
    assert_store_verifies(&e);

    // The link down when the run looks the key up: no lazy mount, a local miss with a warning.
    let f = Runner::via(
        &w,
        &link.endpoint(),
        sb.path("store-f"),
        "cut",
        "lookup_timeout = \"2s\"\n",
    );
    link.down();
    let (rf, _) = run_within(
        &f,
        (&sb, &spec),
        &["cat", "/dev/null"],
        Duration::from_secs(180),
        "run, link down",
    );
    link.up();
    assert_eq!(rf.status.code(), Some(0), "{}", show(&rf));
    let ev = &f.events()[0];
    assert_eq!(
        (&ev["result"], &ev["remote_hit"], &ev["remote_lazy"]),
        (&"miss".into(), &false.into(), &false.into()),
        "{ev}"
    );
    // (A fresh store asks for the key salt first: that is the one warning.)
    let said = stderr(&rf);
    let warnings: Vec<&str> = (said.lines())
        .filter(|l| l.starts_with("layercache: ") && !l.contains(", running setup: "))
        .filter(|l| !l.starts_with("layercache: data miss in "))
        .collect();
    assert!(
        warnings.len() == 1 && warnings[0].contains("no answer within 2 s"),
        "{warnings:?}"
    );
    assert!(!project_dir(&f).join("partial").exists());
    assert!(sb.mounts_below().is_empty());
}

/// The link cut for good mid-run: the first file whose fetch gets no answer fails with EIO
/// after the bound (3 s here), and the remote is then down for the run's fetcher, so each next
/// file not yet local fails at once instead of waiting the bound again (six files opened one
/// after the other: about one bound in all, not six). Once the link is back, a probe (one
/// fetch every 5 s while down) finds the remote and the files are read.
#[test]
fn a_remote_that_stops_answering_costs_one_bound_not_one_per_file_and_comes_back() {
    if !ready() {
        return;
    }
    let Some(w) = Weed::start() else { return };
    let Some(link) = LinkProxy::start(w.endpoint(), 200.0, 5) else {
        return;
    };
    // Six files of 5 MiB (each stored alone in the remote: its own fetch) and a small one.
    let (sb, spec, a, _) = filled_by_a(
        &w,
        "hung",
        &spec_with_setup(
            r#"echo small > $DATA/s.txt
for i in 1 2 3 4 5 6; do head -c 5M /dev/urandom > $DATA/m$i.bin; done"#,
        ),
    );
    let m1 = sha256(&only_layer(&a).join("tree/m1.bin"));
    let control = link.control();
    let c = Runner::via(&w, &link.endpoint(), sb.path("store-c"), "hung", "")
        .with_env("LAYERCACHE_LAZY_TIMEOUT", "3");
    let script = format!(
        "cat $DATA/s.txt; echo down > {ctl}; sleep 0.3; \
         for i in 1 2 3 4 5 6; do t0=$(date +%s%N); \
           if cat $DATA/m$i.bin > /dev/null 2>&1; then r=OK; else r=EIO; fi; \
           echo m$i $r $(( ($(date +%s%N) - t0) / 1000000 )); done; \
         echo up > {ctl}; sleep 6; sha256sum < $DATA/m1.bin",
        ctl = control.display()
    );
    let (rc, _) = run_within(
        &c,
        (&sb, &spec),
        &["sh", "-c", &script],
        Duration::from_secs(180),
        "hung remote run",
    );
    let said = out(&rc);
    let lines: Vec<&str> = said.lines().collect();
    assert_eq!(lines.first(), Some(&"small"), "{said}");
    let reads: Vec<(String, u64)> = (lines.iter().skip(1).take(6))
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (format!("{} {}", f[0], f[1]), f[2].parse().unwrap())
        })
        .collect();
    let names: Vec<&str> = reads.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(
        names,
        ["m1 EIO", "m2 EIO", "m3 EIO", "m4 EIO", "m5 EIO", "m6 EIO"],
        "{said}"
    );
    // The first waited the bound; the five after it together well under five bounds (15 s).
    let rest: u64 = reads[1..].iter().map(|r| r.1).sum();
    eprintln!(
        "LAZY hung remote: first EIO after {} ms, the next five {rest} ms",
        reads[0].1
    );
    assert!(reads[0].1 < 20_000, "{said}");
    assert!(rest < 8_000, "each file waited the bound again: {said}");
    // The link back: a probe finds the remote, the file is read whole.
    assert_eq!(
        lines.get(7).copied(),
        Some(format!("{m1}  -").as_str()),
        "{said}"
    );
    assert_eq!(rc.status.code(), Some(0), "{}", show(&rc));
    // The run names the files that failed and why.
    let e = stderr(&rc);
    assert!(
        e.contains("m2.bin: remote ") && e.contains("not asked: no answer within 3 s at"),
        "{e}"
    );
    assert_store_verifies(&c);
    assert!(sb.mounts_below().is_empty());
}

/// A lazy layer that became complete during the run is published from what the daemon kept
/// (its objects and the compact manifest it checked), so a remote that stopped answering by
/// the run's end costs nothing: the run says the layer is local, and the next run, the link
/// still down, is a local hit.
#[test]
fn a_complete_lazy_layer_is_published_though_the_remote_stopped_answering() {
    if !ready() {
        return;
    }
    let Some(w) = Weed::start() else { return };
    let Some(link) = LinkProxy::start(w.endpoint(), 0.0, 0) else {
        return;
    };
    let (sb, spec, _a, _) = pushed_by_a(&w, "gone", 1);
    let c = Runner::via(&w, &link.endpoint(), sb.path("store-c"), "gone", "")
        .with_env("LAYERCACHE_LAZY_TIMEOUT", "2");
    let script = format!(
        "cat $DATA/a/s1.txt; {}; echo down > {}; sleep 0.3",
        wait_complete(&c),
        link.control().display()
    );
    let (rc, _) = run_within(
        &c,
        (&sb, &spec),
        &["sh", "-c", &script],
        Duration::from_secs(180),
        "run, link cut once complete",
    );
    assert_eq!(rc.status.code(), Some(0), "{}", show(&rc));
    assert_eq!(c.events()[0]["remote_lazy"], true);
    let done = line_of(&rc, "layercache: data: fetched lazily ");
    assert!(
        done.contains("the layer is complete and now local"),
        "{done}"
    );
    assert!(only_layer(&c).join("tree/big.bin").is_file());
    assert_store_verifies(&c);
    let (again, _) = run_within(
        &c,
        (&sb, &spec),
        &["cat", "/dev/null"],
        Duration::from_secs(180),
        "run, link down",
    );
    assert_eq!(again.status.code(), Some(0), "{}", show(&again));
    assert_eq!(c.events()[1]["result"], "hit", "{}", show(&again));
    assert!(sb.mounts_below().is_empty());
}

/// A big file arriving slowly but steadily over the link (12 MiB at 2.5 Mbit/s: about 40 s)
/// is read whole, however long it takes, with `LAYERCACHE_LAZY_TIMEOUT=2`: the bound is on a
/// fetch that makes no progress (docs/remote.md: "a demand read that gets no byte for …"), not
/// on a transfer that does.
#[test]
fn a_slow_but_steady_fetch_is_not_cut_off() {
    if !ready() {
        return;
    }
    let Some(w) = Weed::start() else { return };
    let Some(link) = LinkProxy::start(w.endpoint(), 2.5, 5) else {
        return;
    };
    let (sb, spec, a, _) = pushed_by_a(&w, "slow", 12);
    let big = sha256(&only_layer(&a).join("tree/big.bin"));
    let daemon_log = sb.path("daemon.log");
    let b = Runner::via(&w, &link.endpoint(), sb.path("store-b"), "slow", "")
        .with_env("LAYERCACHE_LAZY_TIMEOUT", "2")
        .with_env("LAYERCACHE_DAEMON_LOG", daemon_log.to_str().unwrap());
    let read = "t0=$(date +%s%N); sha256sum < $DATA/big.bin; s=$?; \
                echo ms $(( ($(date +%s%N) - t0) / 1000000 )); exit $s";
    let (rb, took) = run_within(
        &b,
        (&sb, &spec),
        &["sh", "-c", read],
        Duration::from_secs(300),
        "slow run",
    );
    eprintln!("LAZY slow link: the run took {took:?}");
    let logged = std::fs::read_to_string(&daemon_log).unwrap_or_default();
    assert_eq!(
        rb.status.code(),
        Some(0),
        "{}\ndaemon log:\n{logged}",
        show(&rb)
    );
    assert!(
        out(&rb).starts_with(&format!("{big}  -\nms ")),
        "{}",
        out(&rb)
    );
    assert_store_verifies(&b);
    assert!(sb.mounts_below().is_empty());
}

/// An object missing from the remote (deleted behind the runners' backs): B's lazy run reads
/// the small files correctly, the big file's read fails (EIO: COMMAND fails), the run says the
/// layer is broken and not used again; B's next run does not mount it lazily (a local miss:
/// setup runs) and nothing wrong is ever served.
#[test]
fn a_missing_object_breaks_the_lazy_layer_for_good_and_nothing_wrong_is_served() {
    use futures::TryStreamExt;
    use object_store::{ObjectStore, ObjectStoreExt};
    if !ready() {
        return;
    }
    let Some(w) = Weed::start() else { return };
    let (sb, spec, _a, _) = pushed_by_a(&w, "gone", 6);
    let b = Runner::new(&w, sb.path("store-b"), "gone", "");

    // The big file is the one object stored alone.
    let (rt, client) = (runtime(), s3(&w));
    let objects = object_store::path::Path::from(format!("gone/v1/projects/{PROJECT}/objects"));
    let found: Vec<_> = rt.block_on(async {
        client
            .list(Some(&objects))
            .try_collect::<Vec<_>>()
            .await
            .unwrap()
    });
    assert_eq!(found.len(), 1, "{found:?}");
    rt.block_on(client.delete(&found[0].location)).unwrap();

    let script = "cat $DATA/a/s2.txt $DATA/c/z.txt && sha256sum < $DATA/big.bin";
    let rb = b.run_as(false, &sb, &spec, &["sh", "-c", script]);
    assert_ne!(rb.status.code(), Some(0), "COMMAND read a missing object");
    assert_eq!(
        out(&rb),
        "small 2\nzed\n",
        "only what was there, nothing wrong"
    );
    assert_eq!(b.events()[0]["remote_lazy"], true);
    let e = stderr(&rb);
    assert!(
        e.contains("Input/output error") && e.contains("is broken") && e.contains("not used again"),
        "{e}"
    );
    assert_store_verifies(&b);
    // `ls` says the partial layer is broken, not merely partly here.
    let ls = b.lc(&["ls"]);
    let listed = String::from_utf8_lossy(&ls.stdout);
    let row = (listed.lines())
        .find(|l| l.contains("(remote"))
        .unwrap_or_else(|| panic!("no partial layer in:\n{listed}"));
    assert!(
        row.contains("broken") && row.contains("not used") && !row.contains("mounted lazily"),
        "{row}"
    );

    let again = b.run_as(false, &sb, &spec, &["sh", "-c", script]);
    assert_eq!(again.status.code(), Some(0), "{}", show(&again));
    let ev = &b.events()[1];
    assert_eq!(
        (&ev["result"], &ev["remote_lazy"], &ev["published"]),
        (&"miss".into(), &false.into(), &true.into()),
        "{ev}"
    );
    let said = out(&again);
    assert!(said.starts_with("small 2\nzed\n"), "{said}");
    let own = sha256(&only_layer(&b).join("tree/big.bin"));
    assert_eq!(said, format!("small 2\nzed\n{own}  -\n"), "B's own fill");
    assert!(
        stderr(&again).contains("is marked broken"),
        "{}",
        stderr(&again)
    );
    assert_store_verifies(&b);
    assert!(sb.mounts_below().is_empty());
}

/// A current-thread tokio runtime, for the tests' own S3 requests.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The remote path of layer `layer_id`'s manifest in form `ext` (`json`, `compact`), under
/// the remote prefix `prefix`.
fn manifest_object(prefix: &str, layer_id: &str, ext: &str) -> object_store::path::Path {
    object_store::path::Path::from(format!(
        "{prefix}/v1/projects/{PROJECT}/manifests/{layer_id}.{ext}"
    ))
}

/// A layer pushed by an older version has only the JSON manifest: B's lazy run asks for the
/// tree and the compact forms, gets 404s, reads the JSON and mounts lazily all the same (the
/// right bytes); C's full pull of it is as good; and `remote gc` keeps a live layer's
/// manifests, every form.
#[test]
fn a_layer_without_a_compact_manifest_still_mounts_lazily_and_pulls() {
    use object_store::ObjectStoreExt;
    if !ready() {
        return;
    }
    let Some(w) = Weed::start() else { return };
    let Some(link) = LinkProxy::start(w.endpoint(), 0.0, 0) else {
        return;
    };
    let (sb, spec, a, _) = pushed_by_a(&w, "old", 1);
    let layer = only_layer(&a);
    let layer_id = layer.file_name().unwrap().to_str().unwrap();
    let (rt, client) = (runtime(), s3(&w));
    let manifest = |ext: &str| manifest_object("old", layer_id, ext);
    let exists = |p: &object_store::path::Path| rt.block_on(client.head(p)).is_ok();
    let forms = ["json", "compact", "tree"];
    assert!(forms.iter().all(|f| exists(&manifest(f))));
    // gc keeps a live layer's manifests (grace 0: only liveness protects them).
    let gc = a.lc(&["remote", "gc", "--grace", "0"]);
    assert!(gc.status.success(), "{}", stderr(&gc));
    assert!(forms.iter().all(|f| exists(&manifest(f))));
    rt.block_on(client.delete(&manifest("compact"))).unwrap();
    rt.block_on(client.delete(&manifest("tree"))).unwrap();

    let b = Runner::via(&w, &link.endpoint(), sb.path("store-b"), "old", "");
    let script = "cat $DATA/a/s1.txt $DATA/link && sha256sum < $DATA/big.bin";
    let rb = b.run_as(false, &sb, &spec, &["sh", "-c", script]);
    assert_eq!(rb.status.code(), Some(0), "{}", show(&rb));
    let big = sha256(&layer.join("tree/big.bin"));
    assert_eq!(out(&rb), format!("small 1\ndeep\n{big}  -\n"));
    assert_eq!(b.events()[0]["remote_lazy"], true);
    let asked: Vec<(String, u64)> = (link.log().iter())
        .filter(|r| r["path"].as_str().unwrap().contains("/manifests/"))
        .map(|r| {
            let p = r["path"].as_str().unwrap();
            (
                p.rsplit('.').next().unwrap().to_string(),
                r["status"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        asked[..3],
        [
            ("tree".to_string(), 404),
            ("compact".to_string(), 404),
            ("json".to_string(), 200)
        ],
        "the tree form first, then the compact one, then the JSON: {asked:?}"
    );

    let c = Runner::new(&w, sb.path("store-c"), "old", "").with_env("LAYERCACHE_LAZY", "0");
    let rc = c.run_as(false, &sb, &spec, &["sh", "-c", script]);
    assert_eq!(rc.status.code(), Some(0), "{}", show(&rc));
    assert_eq!(out(&rc), out(&rb));
    assert_eq!(c.events()[0]["remote_lazy"], false);
    assert_store_verifies(&c);
    assert!(sb.mounts_below().is_empty());
}

/// `[remote] lazy = false` pulls a remote hit whole before COMMAND (the summary says "pulled
/// from the remote", no partial layer is made); `LAYERCACHE_LAZY=1` overrides the file for
/// one run and `LAYERCACHE_LAZY=0` overrides the default; `run --lazy true|false` overrides
/// both.
#[test]
fn lazy_is_a_choice_of_the_config_and_the_environment() {
    if !ready() {
        return;
    }
    let Some(w) = Weed::start() else { return };
    let (sb, spec, _a, _) = pushed_by_a(&w, "choice", 1);
    let summary = |r: &Runner| {
        let o = r.run_as(false, &sb, &spec, &["cat", "/dev/null"]);
        assert_eq!(o.status.code(), Some(0));
        line_of(&o, "layercache: data ")
    };
    let whole = Runner::new(&w, sb.path("store-b"), "choice", "lazy = false\n");
    let line = summary(&whole);
    assert!(line.contains("(pulled from the remote: "), "{line}");
    assert_eq!(whole.events()[0]["remote_lazy"], false);
    assert!(!project_dir(&whole).join("partial").exists());

    let over = Runner::new(&w, sb.path("store-c"), "choice", "lazy = false\n")
        .with_env("LAYERCACHE_LAZY", "1");
    let line = summary(&over);
    assert!(line.contains("(mounted lazily from the remote: "), "{line}");

    let env0 = Runner::new(&w, sb.path("store-d"), "choice", "").with_env("LAYERCACHE_LAZY", "0");
    let line = summary(&env0);
    assert!(line.contains("(pulled from the remote: "), "{line}");
    assert_eq!(env0.events()[0]["remote_lazy"], false);

    // `run --lazy false` over the default, `--lazy true` over the environment.
    let flag = |r: &Runner, lazy: &str| {
        let mut args = r.run_args(false, &sb, &spec, &["cat", "/dev/null"]);
        args.insert(1, format!("--lazy={lazy}"));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = r.lc(&args);
        assert_eq!(o.status.code(), Some(0));
        line_of(&o, "layercache: data ")
    };
    let e = Runner::new(&w, sb.path("store-e"), "choice", "");
    assert!(flag(&e, "false").contains("(pulled from the remote: "));
    let f = Runner::new(&w, sb.path("store-f"), "choice", "").with_env("LAYERCACHE_LAZY", "0");
    assert!(flag(&f, "true").contains("(mounted lazily from the remote: "));
    assert!(sb.mounts_below().is_empty());
}

/// The unprivileged user of the rootless test (the one tests/run_rootless.rs uses; made when
/// missing).
const USER: &str = "lcrootless";

/// The test user's (uid, gid), the user made with `useradd` when missing.
fn test_user() -> (u32, u32) {
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
    (num("-u"), num("-g"))
}

/// `layercache ARGS…` as the test user with no capabilities, inside a private mount namespace
/// of the test where a 0666 copy of the `/dev/fuse` node (`fuse_node`) is bound over
/// `/dev/fuse` (as tests/run_rootless.rs does), with only PATH, HOME and `env` set.
fn as_user(
    (uid, gid): (u32, u32),
    fuse_node: &Path,
    home: &Path,
    env: &[(String, String)],
    args: &[&str],
) -> Command {
    let script = format!(
        "mount --bind {} /dev/fuse && exec setpriv --reuid={uid} --regid={gid} --clear-groups \
         --inh-caps=-all -- \"$@\"",
        fuse_node.display()
    );
    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "--propagation", "private", "sh", "-c", &script, "sh"])
        .arg(run_common::BIN)
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    cmd
}

/// A lazy hit without root: the test user (no capabilities; the run's own namespaces) fills
/// and pushes the layer from one store of its own (a root runner's key is not the user's: the
/// layer's owner is part of it), then runs with an empty store and gets the layer mounted
/// lazily; COMMAND reads files and the big file correctly and runs as the user; what it sees
/// of the entries (owner, mode, size, links) is what the same user sees of the layer pulled
/// whole (`LAYERCACHE_LAZY=0`) into a third store; the lazily fetched objects verify clean, and
/// nothing is left mounted.
#[test]
fn a_lazy_hit_works_without_root() {
    if !ready() || !have_tool("unshare") || !have_tool("setpriv") {
        return;
    }
    let Some(w) = Weed::start() else { return };
    let sb = Sandbox::new();
    let spec = sb.write_spec("spec.toml", &data_spec(6));
    let user = test_user();
    // The user's part of the sandbox: its home (stores), workdir and mount root, its own.
    for d in ["u/home", "u/work", "u/cache", "dev"] {
        std::fs::create_dir_all(sb.path(d)).unwrap();
    }
    std::fs::set_permissions(sb.path(""), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(sb.path("u/work/data.lock"), "v1").unwrap();
    let fuse = sb.path("dev/fuse");
    run_ok(Command::new("mknod").args(["-m", "666", fuse.to_str().unwrap(), "c", "10", "229"]));
    let stores: Vec<Runner> = ["fill", "lazy", "whole"]
        .iter()
        .map(|n| Runner::new(&w, sb.path(&format!("u/home/store-{n}")), "rootless", ""))
        .collect();
    run_ok(Command::new("chown").args([
        "-R",
        &format!("{}:{}", user.0, user.1),
        sb.path("u").to_str().unwrap(),
    ]));
    let look = "cd $DATA && cat a/s1.txt link && sha256sum < big.bin && \
                stat -c '%n %u %g %a %s %h' a/s1.txt a/s5.txt c/h1 c/h2 c/run.sh big.bin link \
                && id -u";
    let run = |r: &Runner, lazy: &str| {
        let mut env = r.env.clone();
        env.push(("LAYERCACHE_LAZY".into(), lazy.into()));
        let (work, root) = (sb.path("u/work"), sb.path("u/cache"));
        let args = [
            "--store",
            r.store.to_str().unwrap(),
            "--remote",
            r.url.as_deref().unwrap(),
            "run",
            "--spec",
            spec.to_str().unwrap(),
            "--workdir",
            work.to_str().unwrap(),
            "--mount-root",
            root.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            look,
        ];
        let cmd = as_user(user, &fuse, &sb.path("u/home"), &env, &args);
        let (o, _) = output_within(cmd, Duration::from_secs(180), "user run");
        assert_eq!(o.status.code(), Some(0), "{}", show(&o));
        o
    };
    let filled = run(&stores[0], "1");
    assert!(stderr(&filled).contains("pushed key"), "{}", show(&filled));
    let big = sha256(&only_layer(&stores[0]).join("tree/big.bin"));
    let lazy = run(&stores[1], "1");
    assert!(
        line_of(&lazy, "layercache: data ").contains("(mounted lazily from the remote: "),
        "{}",
        show(&lazy)
    );
    let said = out(&lazy);
    assert!(
        said.starts_with(&format!("small 1\ndeep\n{big}  -\n")),
        "{said}"
    );
    assert!(
        said.ends_with(&format!("\n{}\n", user.0)),
        "COMMAND ran as the user: {said}"
    );
    assert_eq!(
        said,
        out(&filled),
        "the user's lazy mount shows what its filled layer shows"
    );
    let whole = run(&stores[2], "0");
    assert!(
        line_of(&whole, "layercache: data ").contains("(pulled from the remote: "),
        "{}",
        show(&whole)
    );
    assert_eq!(
        said,
        out(&whole),
        "a lazy mount shows what a pulled layer shows"
    );
    // Verified by root (the user's objects are the user's files; root reads them all).
    assert_store_verifies(&stores[1]);
    assert!(sb.mounts_below().is_empty());
}

/// A manifest that breaks the rules a pull checks (here an entry `a/../../escape`, which
/// would name a file outside the layer) is refused by a lazy run as by a full pull: a warning
/// that names the manifest and the rule, the run goes on as a local miss (its own setup),
/// and no partial layer is left of it.
#[test]
fn a_manifest_that_breaks_the_rules_is_refused_and_the_run_is_a_miss() {
    use object_store::ObjectStoreExt;
    if !ready() {
        return;
    }
    let Some(w) = Weed::start() else { return };
    let (sb, spec, a, _) = pushed_by_a(&w, "rules", 1);
    let layer_id = only_layer_id(&a);
    let (rt, client) = (runtime(), s3(&w));
    let manifest = |ext: &str| manifest_object("rules", &layer_id, ext);
    let json = rt
        .block_on(async { client.get(&manifest("json")).await?.bytes().await })
        .unwrap();
    let mut m: serde_json::Value = serde_json::from_slice(&json).unwrap();
    let entries = m["entries"].as_array_mut().unwrap();
    let mut escape = (entries.iter())
        .find(|e| e["type"] == "file")
        .unwrap_or_else(|| panic!("a file entry in {entries:?}"))
        .clone();
    escape["path"] = "a/../../escape".into();
    entries.push(escape);
    let body = serde_json::to_vec(&m).unwrap();
    rt.block_on(client.put(&manifest("json"), body.into()))
        .unwrap();
    rt.block_on(client.delete(&manifest("compact"))).unwrap();
    rt.block_on(client.delete(&manifest("tree"))).unwrap();

    let b = Runner::new(&w, sb.path("store-b"), "rules", "");
    let rb = b.run_as(false, &sb, &spec, &["cat", "/dev/null"]);
    assert_eq!(rb.status.code(), Some(0), "{}", show(&rb));
    let err = stderr(&rb);
    assert!(
        err.contains("not a plain relative path") && err.contains(&layer_id),
        "{err}"
    );
    assert_ne!(b.events()[0]["remote_lazy"], true, "{}", show(&rb));
    assert_ne!(b.events()[0]["result"], "hit", "{}", show(&rb));
    let partial = project_dir(&b).join("partial");
    let left: Vec<_> = std::fs::read_dir(&partial)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "partial layers left: {left:?}");
    assert_store_verifies(&b);
    assert!(sb.mounts_below().is_empty());
}

/// A tree manifest (what a fresh runner mounts from) whose entries break the rules, behind a
/// header that is right: the run hands it to the daemon, which refuses it and marks the
/// partial layer broken; the run then pulls the layer whole (its compact manifest is good)
/// and runs on the right bytes, and the store verifies (a later run that finds the broken
/// mark does not mount that layer lazily: `prepare_lazy` refuses it).
#[test]
fn a_tree_manifest_that_breaks_the_rules_is_refused_by_the_daemon_and_the_run_pulls_whole() {
    use object_store::ObjectStoreExt;
    if !ready() {
        return;
    }
    let Some(w) = Weed::start() else { return };
    let (sb, spec, a, _) = pushed_by_a(&w, "badtree", 1);
    let layer_id = only_layer_id(&a);
    let (rt, client) = (runtime(), s3(&w));
    let tree = manifest_object("badtree", &layer_id, "tree");
    let body = rt
        .block_on(async { client.get(&tree).await?.bytes().await })
        .unwrap();
    let (magic, frame) = body.split_at(8);
    assert_eq!(magic, b"LCTREE1\n");
    let mut raw = zstd::decode_all(frame).unwrap();
    // "a/s1.txt" is stored as "s1.txt" after "a/b/deep.txt" (paths share their prefix):
    // the same length, so the encoding stays whole, but the path becomes "a/../../".
    let at = (raw.windows(6).position(|w| w == b"s1.txt"))
        .unwrap_or_else(|| panic!("no entry s1.txt in the tree manifest"));
    raw[at..at + 6].copy_from_slice(b"../../");
    let mut bad = magic.to_vec();
    bad.extend(zstd::encode_all(raw.as_slice(), 3).unwrap());
    rt.block_on(client.put(&tree, bad.into())).unwrap();

    let b = Runner::new(&w, sb.path("store-b"), "badtree", "");
    let rb = b.run_as(
        false,
        &sb,
        &spec,
        &["sh", "-c", "cat $DATA/a/s1.txt $DATA/link"],
    );
    assert_eq!(rb.status.code(), Some(0), "{}", show(&rb));
    assert_eq!(out(&rb), "small 1\ndeep\n");
    let err = stderr(&rb);
    assert!(
        err.contains("lazily failed") && err.contains("not a plain relative path"),
        "{err}"
    );
    assert_eq!(b.events()[0]["remote_lazy"], false, "{}", show(&rb));
    assert_eq!(b.events()[0]["result"], "hit", "{}", show(&rb));
    let broken = project_dir(&b)
        .join("partial")
        .join(&layer_id)
        .join("broken");
    let why = std::fs::read_to_string(&broken).unwrap_or_default();
    assert!(why.contains("not a plain relative path"), "{why:?}");
    assert_store_verifies(&b);

    assert!(sb.mounts_below().is_empty());
}

/// The GETs of `link`'s log for the objects stored alone under `prefix`, in the order they
/// started: (first byte asked, bytes received).
fn object_gets(link: &LinkProxy, prefix: &str) -> Vec<(u64, u64)> {
    let dir = format!("/{prefix}/v1/projects/{PROJECT}/objects/");
    let mut gets: Vec<(f64, u64, u64)> = (link.log().iter())
        .filter(|r| r["method"] == "GET" && r["path"].as_str().unwrap().contains(&dir))
        .map(|r| {
            let first = (r["range"].as_str())
                .and_then(|h| h.strip_prefix("bytes="))
                .and_then(|h| h.split('-').next())
                .map_or(0, |n| n.parse().unwrap());
            (
                r["t"].as_f64().unwrap(),
                first,
                r["bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    gets.sort_by(|a, b| a.0.total_cmp(&b.0));
    gets.into_iter().map(|(_, f, b)| (f, b)).collect()
}

/// A big object (24 MiB, stored alone) is served piece by piece: A's push writes the layer's
/// piece table; B's read of 1 MiB at 10 MiB gets the right bytes, and its first GET of the
/// object starts at that piece (with its read-ahead), not at byte 0; background completion then fetches the other
/// pieces, each once (24 MiB of object GETs in all), and the published layer is A's file.
/// A read file still shows its own metadata (mode 0600, not the held file's). A piece table
/// whose digests do not make the object's id is ignored (C fetches the object whole, from
/// byte 0, and reads the right bytes); an object whose bytes were changed in the remote
/// fails the read of the changed piece (EIO) and breaks the layer: nothing wrong is served.
#[test]
fn a_big_object_is_served_piece_by_piece_each_piece_verified() {
    use object_store::ObjectStoreExt;
    if !ready() {
        return;
    }
    let Some(w) = Weed::start() else { return };
    let Some(link) = LinkProxy::start(w.endpoint(), 0.0, 0) else {
        return;
    };
    const MIB: u64 = 1 << 20;
    let (sb, spec, a, _) = pushed_by_a(&w, "pieces", 24);
    let layer = only_layer(&a);
    let layer_id = only_layer_id(&a);
    let (rt, client) = (runtime(), s3(&w));
    let table_path = manifest_object("pieces", &layer_id, "pieces");
    let table = rt.block_on(async {
        client
            .get(&table_path)
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap()
    });
    assert!(
        table.starts_with(b"LCPIECE1\n"),
        "{:?}",
        &table[..16.min(table.len())]
    );
    let slice = |root: &Path| {
        let o = run_ok(Command::new("sh").arg("-c").arg(format!(
            "dd if={} bs=1M skip=10 count=1 2>/dev/null | sha256sum",
            root.join("tree/big.bin").display()
        )));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let want = slice(&layer);
    let read = "dd if=$DATA/big.bin bs=1M skip=10 count=1 2>/dev/null | sha256sum; \
                cat $DATA/a/s5.txt > /dev/null; stat -c %a $DATA/a/s5.txt";

    let b = Runner::via(&w, &link.endpoint(), sb.path("store-b"), "pieces", "");
    let script = format!("{read}; {}", wait_complete(&b));
    let rb = b.run_as(false, &sb, &spec, &["sh", "-c", &script]);
    assert_eq!(rb.status.code(), Some(0), "{}", show(&rb));
    assert_eq!(b.events()[0]["remote_lazy"], true);
    assert_eq!(out(&rb), format!("{want}600\n"));
    let gets = object_gets(&link, "pieces");
    // The piece read (and its read-ahead, in the same GET) first.
    assert_eq!(gets[0].0, 10 * MIB, "the piece read first: {gets:?}");
    let total: u64 = gets.iter().map(|g| g.1).sum();
    assert_eq!(total, 24 * MIB, "each piece once: {gets:?}");
    assert_eq!(
        sha256(&only_layer(&b).join("tree/big.bin")),
        sha256(&layer.join("tree/big.bin"))
    );
    assert_store_verifies(&b);

    // A piece table that does not make the object's id: the object is fetched whole.
    let mut bad = table.to_vec();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    rt.block_on(client.put(&table_path, bad.into())).unwrap();
    let before = object_gets(&link, "pieces").len();
    let c = Runner::via(&w, &link.endpoint(), sb.path("store-c"), "pieces", "");
    let rc = c.run_as(false, &sb, &spec, &["sh", "-c", read]);
    assert_eq!(rc.status.code(), Some(0), "{}", show(&rc));
    assert_eq!(out(&rc), format!("{want}600\n"));
    let gets = object_gets(&link, "pieces");
    assert_eq!(gets[before].0, 0, "fetched whole, from byte 0: {gets:?}");
    rt.block_on(client.put(&table_path, table.clone().into()))
        .unwrap();

    // Changed bytes in the remote's object: the changed piece is refused.
    let objects = object_store::path::Path::from(format!("pieces/v1/projects/{PROJECT}/objects"));
    let found: Vec<_> = rt.block_on(async {
        use futures::TryStreamExt;
        use object_store::ObjectStore;
        client
            .list(Some(&objects))
            .try_collect::<Vec<_>>()
            .await
            .unwrap()
    });
    assert_eq!(found.len(), 1, "{found:?}");
    let obj = &found[0].location;
    let mut body = rt
        .block_on(async { client.get(obj).await.unwrap().bytes().await.unwrap() })
        .to_vec();
    body[(10 * MIB + 5) as usize] ^= 0x40;
    rt.block_on(client.put(obj, body.into())).unwrap();
    let d = Runner::via(&w, &link.endpoint(), sb.path("store-d"), "pieces", "");
    let check = "dd if=$DATA/big.bin bs=1M skip=10 count=1 of=/dev/null 2>&1; echo dd=$?";
    let rd = d.run_as(false, &sb, &spec, &["sh", "-c", check]);
    let said = out(&rd);
    assert!(
        said.contains("Input/output error") && !said.contains("dd=0"),
        "{said}"
    );
    assert!(stderr(&rd).contains("is broken"), "{}", show(&rd));
    assert_store_verifies(&d);

    // An object shorter than its manifest says (a read past its end gets a 416): broken too.
    let mut body = rt
        .block_on(async { client.get(obj).await.unwrap().bytes().await.unwrap() })
        .to_vec();
    body.truncate((8 * MIB) as usize);
    rt.block_on(client.put(obj, body.into())).unwrap();
    let e = Runner::via(&w, &link.endpoint(), sb.path("store-e"), "pieces", "");
    let re = e.run_as(false, &sb, &spec, &["sh", "-c", check]);
    let said = out(&re);
    assert!(
        said.contains("Input/output error") && !said.contains("dd=0"),
        "{said}"
    );
    assert!(stderr(&re).contains("is broken"), "{}", show(&re));
    assert_store_verifies(&e);
    assert!(sb.mounts_below().is_empty());
}

/// A local hit records the order in which its run first opened the layer's files and stores
/// it beside the key, once per layer (A's second hit sends no PUT): a fresh runner B's lazy
/// mount of that key replays it although no lazy run ever ran the key.
#[test]
fn a_local_hit_stores_its_trace_once_and_a_fresh_runner_replays_it() {
    use object_store::ObjectStoreExt;
    if !ready() {
        return;
    }
    let Some(w) = Weed::start() else { return };
    let Some(link) = LinkProxy::start(w.endpoint(), 0.0, 0) else {
        return;
    };
    let sb = Sandbox::new();
    let spec = sb.write_spec("spec.toml", &data_spec(1));
    std::fs::write(sb.work().join("data.lock"), "v1").unwrap();
    let a = Runner::via(&w, &link.endpoint(), sb.path("store-a"), "hittrace", "");
    let fill = a.run(&sb, &spec, &[]);
    assert_eq!(fill.status.code(), Some(0), "{}", show(&fill));
    let order = ["c/z.txt", "big.bin", "a/s2.txt"];
    let cat: Vec<String> = order.iter().map(|p| format!("$DATA/{p}")).collect();
    let script = format!("cat {} $DATA/c/z.txt > /dev/null", cat.join(" "));
    let puts = || {
        (link.log().iter())
            .filter(|r| r["method"] == "PUT" && r["path"].as_str().unwrap().contains("/traces/"))
            .count()
    };
    for n in 0..2 {
        let hit = a.run_as(false, &sb, &spec, &["sh", "-c", &script]);
        assert_eq!(hit.status.code(), Some(0), "{}", show(&hit));
        assert_eq!(a.events()[n + 1]["result"], "hit");
        assert_eq!(puts(), 1, "one trace per layer, after hit {n}");
    }
    assert!(only_layer(&a).join("trace-stored").exists());
    let key = a.events()[0]["key"].as_str().unwrap().to_string();
    let path = object_store::path::Path::from(format!(
        "hittrace/v1/projects/{PROJECT}/caches/data/traces/{key}"
    ));
    let (rt, client) = (runtime(), s3(&w));
    let stored = rt.block_on(async { client.get(&path).await.unwrap().bytes().await.unwrap() });
    let want: String = order.iter().map(|p| format!("{p}\n")).collect();
    assert_eq!(String::from_utf8_lossy(&stored), want);

    let b = Runner::via(&w, &link.endpoint(), sb.path("store-b"), "hittrace", "");
    let replay = format!("cat {}/partial/*/replay", project_dir(&b).display());
    let rb = b.run_as(false, &sb, &spec, &["sh", "-c", &replay]);
    assert_eq!(rb.status.code(), Some(0), "{}", show(&rb));
    assert_eq!(b.events()[0]["remote_lazy"], true);
    assert_eq!(out(&rb), want, "B replays A's hit's trace");

    // A trace the key has already (a lazy run's, say) stays: a local hit only fills a gap.
    rt.block_on(client.put(&path, "a/s1.txt\nc/z.txt\n".into()))
        .unwrap();
    std::fs::remove_file(only_layer(&a).join("trace-stored")).unwrap();
    let hit = a.run_as(false, &sb, &spec, &["sh", "-c", "cat $DATA/a/s3.txt"]);
    assert_eq!(hit.status.code(), Some(0), "{}", show(&hit));
    let kept = rt.block_on(async { client.get(&path).await.unwrap().bytes().await.unwrap() });
    assert_eq!(String::from_utf8_lossy(&kept), "a/s1.txt\nc/z.txt\n");
    assert!(only_layer(&a).join("trace-stored").exists());
    assert!(sb.mounts_below().is_empty());
}

/// The `.fetch-*` files in partial layer `dir` (temporary files of fetches).
fn fetch_temps(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(".fetch-"))
                .collect()
        })
        .unwrap_or_default()
}

/// The bytes of every object of `kind` (`packs`, `objects`) under the remote prefix `prefix`
/// (`.idx` files left out).
fn remote_bytes(w: &Weed, prefix: &str, kind: &str) -> u64 {
    use futures::TryStreamExt;
    use object_store::ObjectStore;
    let (rt, client) = (runtime(), s3(w));
    let dir = object_store::path::Path::from(format!("{prefix}/v1/projects/{PROJECT}/{kind}"));
    let metas: Vec<_> = rt.block_on(async {
        client
            .list(Some(&dir))
            .try_collect::<Vec<_>>()
            .await
            .unwrap()
    });
    (metas.iter())
        .filter(|m| !m.location.as_ref().ends_with(".idx"))
        .map(|m| m.size)
        .sum()
}

/// Two fresh lazy runs at once on one store (one partial layer, two daemons) share their
/// fetches: both read the same files at the same moment (a barrier: a file each, by mktemp,
/// for each run has its own PID namespace and `$$`; then both wait until both daemons have
/// the whole layer — the first to see it leaves a mark, as its run's report then goes), yet
/// every byte of the stored-alone big file and of the packs crosses the link once; both see the right bytes;
/// neither says the other's fill "ended without publishing it" (the other mounted the layer
/// lazily: it published nothing and was not meant to); both find the layer complete and
/// neither fails to publish it (they take turns; the later one finds it published), and the
/// layer verifies, with no fetch temp file left in its partial directory.
#[test]
fn concurrent_lazy_runs_on_one_store_fetch_each_object_once() {
    if !ready() {
        return;
    }
    let Some(w) = Weed::start() else { return };
    let Some(link) = LinkProxy::start(w.endpoint(), 40.0, 5) else {
        return;
    };
    let (sb, spec, a, _) = pushed_by_a(&w, "twice", 6);
    let big = sha256(&only_layer(&a).join("tree/big.bin"));
    let b = Runner::via(&w, &link.endpoint(), sb.path("store-b"), "twice", "");
    let barrier = sb.path("barrier");
    std::fs::create_dir_all(&barrier).unwrap();
    let reports = format!("{}/runs/*/lazy-report.json", project_dir(&b).display());
    let script = format!(
        "set -e; mktemp -p {d} > /dev/null; i=0; while [ $(ls {d} | wc -l) -lt 2 ]; do \
         i=$((i + 1)); [ $i -lt 1200 ]; sleep 0.05; done; \
         cat $DATA/a/s1.txt $DATA/c/z.txt; sha256sum < $DATA/big.bin; \
         for i in $(seq 1200); do if [ -e {d}.done ] || \
         [ $(grep -ls '\"complete\":true' {reports} | wc -l) -ge 2 ]; then touch {d}.done; \
         break; fi; sleep 0.1; done",
        d = barrier.display()
    );
    let args = b.run_args(false, &sb, &spec, &["sh", "-c", &script]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let runs: Vec<_> = (0..2)
        .map(|i| {
            let c = b.command(&args);
            std::thread::spawn(move || {
                output_within(c, Duration::from_secs(300), &format!("run {i}")).0
            })
        })
        .collect();
    let outs: Vec<Output> = runs.into_iter().map(|h| h.join().unwrap()).collect();
    for o in &outs {
        assert_eq!(o.status.code(), Some(0), "{}", show(o));
        assert_eq!(out(o), format!("small 1\nzed\n{big}  -\n"));
        let e = stderr(o);
        assert!(
            !e.contains("ended without publishing it") && !e.contains("filling it here"),
            "{e}"
        );
        // Both found the layer complete; one published it, the other found it published.
        let done = line_of(o, "layercache: data: fetched lazily ");
        assert!(
            done.contains("the layer is complete and now local"),
            "{done}"
        );
    }
    let ev = b.events();
    assert_eq!(ev.len(), 2, "{ev:?}");
    assert!(ev.iter().all(|e| e["remote_lazy"] == true), "{ev:?}");

    let log = link.log();
    let got = |what: &str| -> u64 {
        (log.iter())
            .filter(|r| r["method"] == "GET" && r["path"].as_str().unwrap().contains(what))
            .map(|r| r["bytes"].as_u64().unwrap())
            .sum()
    };
    assert_eq!(got("/objects/"), 6 << 20, "the big file came once: {log:?}");
    let packs = remote_bytes(&w, "twice", "packs");
    assert!(
        got("/packs/") <= packs,
        "{} bytes of pack fetched, the packs hold {packs}: {log:?}",
        got("/packs/")
    );

    assert_store_verifies(&b);
    let layer_id = only_layer_id(&b);
    let partial = project_dir(&b).join("partial").join(&layer_id);
    assert_eq!(fetch_temps(&partial), Vec::<String>::new());
    assert!(sb.mounts_below().is_empty());
}

/// Temporary files of a fetch cut off by a crash go: one left in the partial directory
/// (nothing holds it) is gone at the next open of the partial layer, and one a run leaves
/// behind is gone once the layer is published.
#[test]
fn fetch_temp_files_go_at_the_next_open_and_when_the_layer_is_published() {
    if !ready() {
        return;
    }
    let Some(w) = Weed::start() else { return };
    let (sb, spec, a, _) = pushed_by_a(&w, "temps", 1);
    let layer_id = only_layer_id(&a);
    let b = Runner::new(&w, sb.path("store-b"), "temps", "");
    let r1 = b.run_as(false, &sb, &spec, &["sh", "-c", "cat $DATA/a/s1.txt"]);
    assert_eq!(r1.status.code(), Some(0), "{}", show(&r1));
    let partial = project_dir(&b).join("partial").join(&layer_id);
    assert!(partial.is_dir(), "the first run left its partial layer");
    // What a daemon killed mid-fetch leaves: a temporary file that no fetch holds.
    let plant = |name: &str| {
        format!(
            "echo junk > {p}/{name} && touch -d '-1 minute' {p}/{name}",
            p = partial.display()
        )
    };
    run_ok(Command::new("sh").args(["-c", &plant(".fetch-0123456789abcdef")]));
    let script = format!(
        "ls -a {p} | grep -c '^\\.fetch-' || true; {}; {}",
        plant(".fetch-fedcba9876543210"),
        wait_complete(&b),
        p = partial.display()
    );
    let r2 = b.run_as(false, &sb, &spec, &["sh", "-c", &script]);
    assert_eq!(r2.status.code(), Some(0), "{}", show(&r2));
    assert_eq!(out(&r2), "0\n", "the open removed the stale temporary file");
    let done = line_of(&r2, "layercache: data: fetched lazily ");
    assert!(done.contains("now local"), "{done}");
    assert_eq!(fetch_temps(&partial), Vec::<String>::new());
    assert_store_verifies(&b);
    assert!(sb.mounts_below().is_empty());
}

/// A layer whose compact manifest is gone from the remote, its tree and JSON manifests still
/// there: the lazy daemon (which fetches the object table after the mount) falls back to the
/// JSON manifest, checked as a full pull checks it, serves the right bytes and completes; the
/// layer is not marked broken.
#[test]
fn a_lazy_daemon_falls_back_to_the_json_manifest_when_the_compact_one_is_missing() {
    use object_store::ObjectStoreExt;
    if !ready() {
        return;
    }
    let Some(w) = Weed::start() else { return };
    let (sb, spec, a, _) = pushed_by_a(&w, "nocompact", 1);
    let layer = only_layer(&a);
    let layer_id = only_layer_id(&a);
    let (rt, client) = (runtime(), s3(&w));
    rt.block_on(client.delete(&manifest_object("nocompact", &layer_id, "compact")))
        .unwrap();
    let b = Runner::new(&w, sb.path("store-b"), "nocompact", "");
    let script = format!(
        "cat $DATA/a/s1.txt $DATA/link && sha256sum < $DATA/big.bin && {}",
        wait_complete(&b)
    );
    let rb = b.run_as(false, &sb, &spec, &["sh", "-c", &script]);
    assert_eq!(rb.status.code(), Some(0), "{}", show(&rb));
    let big = sha256(&layer.join("tree/big.bin"));
    assert_eq!(out(&rb), format!("small 1\ndeep\n{big}  -\n"));
    assert_eq!(b.events()[0]["remote_lazy"], true);
    assert!(!stderr(&rb).contains("broken"), "{}", stderr(&rb));
    let done = line_of(&rb, "layercache: data: fetched lazily ");
    assert!(done.contains("now local"), "{done}");
    let broken = project_dir(&b)
        .join("partial")
        .join(&layer_id)
        .join("broken");
    assert!(!broken.exists());
    assert_store_verifies(&b);
    assert!(sb.mounts_below().is_empty());
}
