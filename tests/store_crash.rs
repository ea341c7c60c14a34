//! Crash consistency: a process publishing layers in a loop is killed with SIGKILL at random
//! moments; afterwards every published key points at a complete layer, nothing partial is
//! visible, and gc removes exactly the staging garbage and unpublished layers. No mounts: the
//! child calls `Store::promote_dirs` (what `commit` does after unmounting).
//!
//! The child is this test binary re-executed with `LC_CRASH_CHILD=<dir>`.

use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use layercache::ids::{CacheId, CacheKey, ProjectId};
use layercache::store::{GcOptions, Store};

fn child(dir: &Path) {
    let store = Store::open(Some(&dir.join("store"))).unwrap();
    let (p, c) = (ProjectId::new("p").unwrap(), CacheId::new("c").unwrap());
    let upper = dir.join(format!("upper-{}", std::process::id()));
    for i in 0..399 {
        fs::create_dir_all(upper.join(format!("d{}", i % 20))).unwrap();
        fs::write(
            upper.join(format!("d{}/f{i}", i % 20)),
            format!("{i}").repeat(100),
        )
        .unwrap();
    }
    // Tell the parent the (slow, load-dependent) startup is over: its kills land in publishes.
    fs::write(dir.join(format!("ready-{}", std::process::id())), "").unwrap();
    for n in 0.. {
        // A new inode each time: the previous one is an object now and must not change.
        let tmp = upper.join(".counter.tmp");
        fs::write(&tmp, format!("{}-{n}", std::process::id())).unwrap();
        fs::rename(&tmp, upper.join("counter")).unwrap();
        let key = CacheKey::new(format!("k{}", n % 7)).unwrap();
        store
            .promote_dirs(&p, &c, &key, None, Some(&upper))
            .unwrap();
        if n == 0 {
            // The parent's last round waits for this: at least one publish completes however
            // slow the machine is.
            fs::write(dir.join(format!("published-{}", std::process::id())), "").unwrap();
        }
    }
}

#[test]
fn kill_9_mid_publish_leaves_the_store_consistent() {
    if let Ok(dir) = std::env::var("LC_CRASH_CHILD") {
        child(Path::new(&dir));
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    for round in 0..12u64 {
        let mut ch = Command::new(&exe)
            .args([
                "--exact",
                "kill_9_mid_publish_leaves_the_store_consistent",
                "--nocapture",
            ])
            .env("LC_CRASH_CHILD", t.path())
            .spawn()
            .unwrap();
        // Wait until the child is past its startup (a loaded CI machine can take seconds to
        // start a test binary), then vary the kill point over the publish loop.
        let ready = t.path().join(format!("ready-{}", ch.id()));
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !ready.exists() && std::time::Instant::now() < deadline {
            if ch.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        if round == 11 {
            // The last round kills only after a publish completed (bounded), so the check
            // below has a layer to look at on a loaded machine too.
            let published = t.path().join(format!("published-{}", ch.id()));
            while !published.exists() && std::time::Instant::now() < deadline {
                if ch.try_wait().unwrap().is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        std::thread::sleep(Duration::from_millis(20 + (round * 37) % 200));
        let kill = ch.kill(); // SIGKILL
        let status = ch.wait().unwrap();
        // A child that ended on its own (a panic in the publish loop, say) was never killed
        // mid-publish: the round would prove nothing.
        assert_eq!(
            status.signal(),
            Some(libc::SIGKILL),
            "round {round}: the child was not killed by SIGKILL but ended with {status} (kill: \
             {kill:?}); its output is above"
        );
    }
    let store = Store::open(Some(&t.path().join("store"))).unwrap();
    let p = ProjectId::new("p").unwrap();
    let pd = store.project(&p).unwrap();
    let keys = pd.all_keys().unwrap();
    assert!(!keys.is_empty(), "no publish completed in 12 rounds");
    for (_, k, id) in &keys {
        let l = pd.layer(id);
        let m = l.manifest().unwrap_or_else(|e| panic!("key {k}: {e}"));
        assert_eq!(&m.key, k);
        let mut files = 0;
        for d in fs::read_dir(l.tree()).unwrap() {
            let d = d.unwrap();
            if d.file_type().unwrap().is_dir() {
                files += fs::read_dir(d.path()).unwrap().count() as u64;
            } else {
                files += 1;
            }
        }
        assert_eq!(files, m.counts.files, "key {k}: layer {id} is incomplete");
        assert_eq!(m.counts.files, 400);
    }
    let r = store.gc(&GcOptions::default()).unwrap();
    eprintln!("after 12 kills: {} keys; gc: {r:?}", keys.len());
    assert!(
        fs::read_dir(pd.staging()).unwrap().next().is_none(),
        "staging left behind"
    );
    let layers = pd.layer_ids().unwrap();
    assert_eq!(
        layers.len(),
        keys.len(),
        "every remaining layer is published"
    );
    let v = store.verify(Some(&p)).unwrap();
    assert!(
        v.bad_objects.is_empty() && v.quarantined.is_empty(),
        "{v:?}"
    );
    // The survivors still look up as hits.
    for (c, k, id) in &keys {
        let found = store.lookup(&pd, c, k, &[]).unwrap();
        assert_eq!(found, layercache::store::Lookup::Hit { layer: id.clone() });
    }
}
