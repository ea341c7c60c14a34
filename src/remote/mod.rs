//! The remote tier: layers travel between machines through an S3-compatible object store (S3,
//! GCS's S3 interface, Ceph RGW, MinIO, SeaweedFS) — or a shared directory — by way of Apache
//! Arrow's `object_store` crate. Everything codes against one `Arc<dyn ObjectStore>` built from
//! the configuration (`config`, [`RemoteConfig`]), so the same code runs over
//! `LocalFileSystem`/`InMemory` in unit tests and over a real S3 server in the integration tests.
//!
//! It stands above the store: it implements the store's port [`crate::store::RemoteTier`] (a
//! local miss asks it, a publish pushes through it) and the store never names its types. Its
//! modules are private; this module re-exports what the commands use.
//!
//! * Layout and guarantees: `layout` ([`Layout`]: per-project prefix; objects by blake3, a
//!   manifest per layer, create-only keys written last).
//! * Lookup + pull (`pull`): on a local miss of the exact key, `mount`/`run` ask the remote
//!   for it, then (when nothing local matches a restore key either) for the newest key of each
//!   restore prefix; a hit pulls the manifest and only the objects missing locally — bounded
//!   parallel, streamed, blake3-verified on arrival — and publishes the layer through the
//!   store's normal publish path ([`crate::store::Store::publish_built`]). Nothing is
//!   published locally until every object is in place.
//! * Push (`push`): after a local publish: objects the remote lacks, then the manifest, then
//!   the key with a conditional create (`PutMode::Create`, `If-None-Match: *`). `run` pushes in
//!   the background of COMMAND and its exit waits for the push (bounded by `push_wait`).
//! * Faults: a remote that is unreachable, slow or refuses the credentials never fails a run:
//!   the mount proceeds as a local miss and one warning line says why. The first request of a
//!   process that times out, cannot connect or is refused marks the remote down for the rest
//!   of the process ([`Remote::is_down`]): the key salt, the lookups of the other caches, the
//!   trace, a lazy layer's publish and the pushes then skip it at once, so a remote that does
//!   not answer costs one bounded wait per run. `remote gc` (`gc`) removes what an interrupted
//!   or losing push left behind.

#![forbid(unsafe_code)]

mod compact;
mod config;
mod error;
mod layout;
pub mod lazy;
mod manifest;
mod pack;
pub(crate) mod pieces;
mod pull;
mod push;
mod salt;
mod sweep;
mod unpack;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use object_store::ObjectStore;
use parking_lot::Mutex;

use crate::error::{Error, RemoteKind, Result};
use crate::ids::{CacheId, CacheKey, LayerId, ProjectId};
use crate::store::{Fetched, Notice, ProjectDirs, RemoteTier, Store};
pub use config::{RemoteConfig, lazy_env};
pub use error::RemoteError;
pub use layout::Layout;
pub use manifest::KeyRecord;

/// An open remote: the object store, its layout and the runtime its requests run on.
pub struct Remote {
    cfg: RemoteConfig,
    store: Arc<dyn ObjectStore>,
    layout: Layout,
    rt: tokio::runtime::Runtime,
    warned: AtomicBool,
    /// False once a request of this process timed out, could not connect or had its
    /// credentials refused ([`Remote::block_on`] sets it): the remote is down for the rest of
    /// the process ([`Remote::is_down`]) — the run's later remote steps skip it at once (the
    /// one warning said so), so a dead remote costs one wait and one line, not one per cache,
    /// trace or publish.
    healthy: AtomicBool,
    pushes: Mutex<Pending>,
}

/// Background pushes not yet waited for.
#[derive(Default)]
struct Pending {
    running: usize,
    done: Option<(mpsc::Sender<PushDone>, mpsc::Receiver<PushDone>)>,
}

/// A finished background push: what it was for and how it went.
type PushDone = (String, Result<push::PushReport>);

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("url", &self.cfg.url)
            .finish()
    }
}

impl Remote {
    /// Opens the remote `cfg` describes (builds the object store; no request is made).
    ///
    /// Errors: as [`RemoteConfig::build`]; [`Error::Io`] when the runtime cannot start.
    pub fn open(cfg: RemoteConfig) -> Result<Remote> {
        let store = cfg.build()?;
        Remote::with_store(cfg, store)
    }

    /// A remote over an already-built object store (tests use `InMemory`/`LocalFileSystem`).
    ///
    /// Errors: [`Error::Io`] when the runtime cannot start.
    pub fn with_store(cfg: RemoteConfig, store: Arc<dyn ObjectStore>) -> Result<Remote> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("layercache-remote")
            .enable_all()
            .build()
            .map_err(|e| Error::io("tokio runtime", e))?;
        Ok(Remote {
            layout: Layout::new(&cfg.prefix),
            cfg,
            store,
            rt,
            warned: AtomicBool::new(false),
            healthy: AtomicBool::new(true),
            pushes: Mutex::new(Pending::default()),
        })
    }

    /// The URL (for messages).
    pub fn url(&self) -> &str {
        &self.cfg.url
    }

    /// The layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Runs `fut` on the remote's runtime, giving up after `limit` with a timeout error. A
    /// timeout, a connection that failed or refused credentials mark the remote down for the
    /// rest of the process ([`Remote::mark_unhealthy`]); the call itself does not check that
    /// (the steps of a run do, [`Remote::is_down`]).
    ///
    /// Errors: whatever `fut` returns; [`RemoteError::Timeout`] naming the remote on timeout.
    pub fn block_on<T>(
        &self,
        limit: Option<Duration>,
        fut: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let r = self.block_on_inner(limit, fut);
        if let Err(Error::Remote { kind, .. }) = &r
            && (kind.is_transient() || *kind == RemoteKind::Denied)
        {
            self.mark_unhealthy();
        }
        r
    }

    /// [`Remote::block_on`] without marking the remote down.
    fn block_on_inner<T>(
        &self,
        limit: Option<Duration>,
        fut: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        match limit {
            None => self.rt.block_on(fut),
            Some(d) => self
                .rt
                .block_on(async { tokio::time::timeout(d, fut).await })
                .unwrap_or_else(|_| {
                    Err(RemoteError::Timeout {
                        url: self.cfg.url.clone(),
                        what: "(lookup_timeout)".into(),
                        secs: d.as_secs_f64(),
                        source: None,
                    }
                    .into())
                }),
        }
    }

    /// Every object below `dir`. A prefix that holds nothing is empty, also where the server
    /// answers 404 for it (SeaweedFS does for a prefix no object was ever written under).
    ///
    /// Errors: [`RemoteError`] naming the remote.
    pub async fn list_dir(
        &self,
        dir: &object_store::path::Path,
    ) -> Result<Vec<object_store::ObjectMeta>> {
        use futures::TryStreamExt;
        match self.store.list(Some(dir)).try_collect().await {
            Ok(v) => Ok(v),
            Err(e) if is_not_found(&e) => Ok(Vec::new()),
            Err(e) => Err(self.error("listing", e)),
        }
    }

    /// Turns an object_store error met while doing `what` into a [`RemoteError`] of its kind
    /// (one line naming the remote; wrong or missing credentials say which variables to check
    /// instead of an HTTP dump).
    pub fn error(&self, what: &str, e: object_store::Error) -> Error {
        RemoteError::from_store(
            &self.cfg.url,
            self.cfg.endpoint.as_deref(),
            self.cfg.timeout,
            what,
            e,
        )
        .into()
    }

    /// Sends `msg` as a [`Notice::Remote`] of `store` the first time only (a run with a broken
    /// remote gets one warning, not one per cache or object).
    pub fn warn_once(&self, store: &Store, msg: &str) {
        if !self.warned.swap(true, Ordering::SeqCst) {
            store.notify(Notice::Remote {
                message: msg.to_string(),
            });
        }
    }

    /// Marks the remote as down for the rest of this process (see [`Remote::is_down`]).
    pub fn mark_unhealthy(&self) {
        self.healthy.store(false, Ordering::SeqCst);
    }

    /// Whether a request of this process timed out, could not connect or had its credentials
    /// refused: the remote is then not asked again by this process (a run's key salt, lookups,
    /// traces, lazy publishes and pushes skip it at once).
    pub fn is_down(&self) -> bool {
        !self.healthy.load(Ordering::SeqCst)
    }

    /// [`RemoteError::Down`] of this remote, for a step that skips it.
    fn down_error(&self) -> Error {
        RemoteError::Down {
            url: self.cfg.url.clone(),
        }
        .into()
    }
}

/// The store's port to this tier: a local miss asks [`RemoteTier::fetch_for_mount`], a publish
/// starts [`RemoteTier::push_background`].
impl RemoteTier for Remote {
    /// The mount's remote step: find `key` (then `restore_keys`) on the remote within
    /// `lookup_timeout` and pull what was found. Never fails: an unreachable, slow or refusing
    /// remote, or a broken layer, costs one warning and the mount goes on as a local miss; a
    /// remote that is down in this process ([`Remote::is_down`]) is not asked (no wait, no
    /// second warning).
    fn fetch_for_mount(
        &self,
        store: &Store,
        pd: &ProjectDirs,
        cache: &CacheId,
        key: &CacheKey,
        restore_keys: &[CacheKey],
        lazy: bool,
    ) -> Option<Fetched> {
        if self.is_down() {
            tracing::info!(%cache, %key, "remote down in this process: not asked");
            return None;
        }
        let found = self.block_on(
            Some(self.cfg.lookup_timeout),
            self.find(&pd.project, cache, key, restore_keys),
        );
        let r = found.and_then(|f| match f {
            Some(f) if f.exact && lazy && self.cfg.lazy => self
                .prepare_lazy(pd, cache, &f)
                .map(|l| Some(Fetched::Lazy(l))),
            Some(f) => self
                .pull(store, pd, cache, &f)
                .map(|r| Some(Fetched::Pulled(r))),
            None => Ok(None),
        });
        match r {
            Ok(rep) => rep,
            // Unreachable, slow or refusing: the remote is no use for the rest of this run.
            Err(e @ Error::Remote { kind, .. })
                if kind.is_transient() || kind == RemoteKind::Denied =>
            {
                self.mark_unhealthy();
                self.warn_once(
                    store,
                    &format!(
                        "{e}; going on without the remote for this run (a local miss; nothing \
                         is pushed)"
                    ),
                );
                None
            }
            // A broken key or layer (corrupt, missing objects) or a local failure: this
            // layer is skipped, the remote stays in use (the new layer is pushed).
            Err(e) => {
                store.notify(Notice::Remote {
                    message: format!(
                        "pulling {cache} key {key} from the remote failed: {e}; going on as a \
                         local miss"
                    ),
                });
                None
            }
        }
    }

    /// Starts pushing layer `layer` of `pd` under `cache`/`key` on a thread of its own; the
    /// result is collected by [`RemoteTier::wait_pushes`]. Nothing happens once a lookup has failed
    /// in this process ([`Remote::mark_unhealthy`]).
    fn push_background(
        self: Arc<Self>,
        pd: ProjectDirs,
        cache: CacheId,
        key: CacheKey,
        layer: LayerId,
    ) {
        if !self.healthy.load(Ordering::SeqCst) {
            return;
        }
        let tx = {
            let mut p = self.pushes.lock();
            p.running += 1;
            p.done.get_or_insert_with(mpsc::channel).0.clone()
        };
        let what = format!("{}/{cache} key {key}", pd.project);
        std::thread::spawn(move || {
            let r = self.push_layer(&pd, &cache, &key, &layer);
            let _ = tx.send((what, r));
        });
    }

    /// The remote's key salt of `project` (or `proposed`, created there create-only) within
    /// `lookup_timeout`; an unreachable, slow or refusing remote is one warning and `None`
    /// (the store keeps its local salt and asks again when a run next publishes), as is
    /// (without a warning or a wait) a remote that is down in this process.
    fn agree_salt(
        &self,
        store: &Store,
        project: &ProjectId,
        proposed: &[u8; 32],
    ) -> Option<[u8; 32]> {
        if self.is_down() {
            return None;
        }
        let r = self.block_on(
            Some(self.cfg.lookup_timeout),
            self.agree_salt_async(project, proposed),
        );
        match r {
            Ok(s) => Some(s),
            Err(e) => {
                let message = match self.is_down() {
                    // (block_on marked it.)
                    true => format!(
                        "{e}; going on without the remote for this run (with this store's own \
                         key salt: keys agree with the remote's once it answers; a local miss, \
                         nothing is pushed this run)"
                    ),
                    false => format!(
                        "{e}; going on with this store's own key salt (keys agree with the \
                         remote's once it answers)"
                    ),
                };
                self.warn_once(store, &message);
                None
            }
        }
    }

    fn finish_lazy(
        &self,
        store: &Store,
        pd: &ProjectDirs,
        cache: &CacheId,
        key: &CacheKey,
        layer: &LayerId,
        run_dir: &std::path::Path,
    ) -> Option<crate::store::LazyEnd> {
        self.finish_lazy_layer(store, pd, cache, key, layer, run_dir)
    }

    fn store_trace(
        &self,
        pd: &ProjectDirs,
        cache: &CacheId,
        key: &CacheKey,
        trace: &std::path::Path,
    ) -> bool {
        let trace = std::fs::read(trace).unwrap_or_default();
        !trace.is_empty() && self.put_trace(pd, cache, key, trace, true)
    }

    fn location(&self) -> String {
        self.cfg.url.clone()
    }

    /// Waits for the background pushes, at most `push_wait` in all; reports each as one
    /// [`Notice::Remote`] of `store` and returns how many did not finish in time (they are
    /// abandoned: the remote then lacks those keys, never has a key without its objects).
    fn wait_pushes(&self, store: &Store) -> usize {
        let say = |message: String| store.notify(Notice::Remote { message });
        let deadline = Instant::now() + self.cfg.push_wait;
        loop {
            let rx_ready = {
                let p = self.pushes.lock();
                if p.running == 0 {
                    return 0;
                }
                p.done.is_some()
            };
            if !rx_ready {
                return 0;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let got = {
                let p = self.pushes.lock();
                let (_, rx) = p.done.as_ref().expect("checked above");
                rx.recv_timeout(left)
            };
            match got {
                Ok((what, r)) => {
                    self.pushes.lock().running -= 1;
                    match r {
                        Ok(rep) => say(rep.summary(&self.cfg.url)),
                        Err(e) => say(format!(
                            "push of {what} to the remote failed: {e} (the run is unaffected; \
                             `layercache remote push` retries)"
                        )),
                    }
                }
                Err(_) => {
                    let n = self.pushes.lock().running;
                    say(format!(
                        "{n} push(es) to remote {} still running after {} s (push_wait); \
                         abandoned — the remote gets no key for them",
                        self.cfg.url,
                        self.cfg.push_wait.as_secs()
                    ));
                    return n;
                }
            }
        }
    }
}

/// Opens the remote for a store: `--remote URL` (`flag`) or `[remote]` of config.toml; `None`
/// when neither names one. `lazy` (`run --lazy`) overrides whether exact hits mount lazily.
///
/// Errors: [`RemoteError::BadConfig`] (exit 2) for a bad `[remote]` entry or URL, or missing
/// credentials.
pub fn open_for(
    store: &crate::store::Store,
    flag: Option<&str>,
    lazy: Option<bool>,
) -> Result<Option<Arc<Remote>>> {
    let file = store.remote_file().cloned().unwrap_or_default();
    match file.resolve(flag)? {
        Some(mut cfg) => {
            cfg.lazy = lazy.unwrap_or(cfg.lazy);
            Ok(Some(Arc::new(Remote::open(cfg)?)))
        }
        None => Ok(None),
    }
}

/// [`open_for`] and attach it to `store` (see [`crate::store::Store::set_remote`]).
///
/// Errors: as [`open_for`].
pub fn attach(
    store: &mut crate::store::Store,
    flag: Option<&str>,
    lazy: Option<bool>,
) -> Result<()> {
    if let Some(r) = open_for(store, flag, lazy)? {
        store.set_remote(r);
    }
    Ok(())
}

/// A 404, typed or (as S3 listings report it) only in the message.
fn is_not_found(e: &object_store::Error) -> bool {
    error::classify(e) == error::Kind::NotFound
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{CacheId, CacheKey, ProjectId};
    use crate::store::Store;
    use std::fs;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::path::Path;

    fn remote_at(dir: &Path) -> Arc<Remote> {
        let cfg = crate::store::RemoteFile {
            concurrency: Some(4),
            ..Default::default()
        }
        .resolve(Some(&format!("file://{}", dir.display())))
        .unwrap()
        .unwrap();
        Arc::new(Remote::open(cfg).unwrap())
    }

    /// `rel kind mode uid mtime content-or-target`, sorted: what must survive a round trip.
    fn listing(root: &Path) -> Vec<String> {
        let mut out = Vec::new();
        let mut stack = vec![root.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                let m = fs::symlink_metadata(&p).unwrap();
                let rel = p.strip_prefix(root).unwrap().display().to_string();
                let what = if m.is_dir() {
                    stack.push(p.clone());
                    "dir".to_string()
                } else if m.file_type().is_symlink() {
                    format!("-> {}", fs::read_link(&p).unwrap().display())
                } else {
                    format!("= {}", String::from_utf8_lossy(&fs::read(&p).unwrap()))
                };
                out.push(format!(
                    "{rel} {:o} {}:{} {}.{} {what}",
                    m.mode(),
                    m.uid(),
                    m.gid(),
                    m.mtime(),
                    m.mtime_nsec()
                ));
            }
        }
        out.sort();
        out
    }

    /// Runners sharing a remote agree on a project's key salt. A fresh store
    /// publishes its own (create-only) and a second fresh store adopts it; a store that had
    /// its own salt before the remote was configured adopts the remote's (once; then it is not
    /// asked again); another project gets another salt.
    #[test]
    fn stores_sharing_a_remote_agree_on_the_key_salt() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("remote");
        let p = ProjectId::new("p").unwrap();
        let with_remote = |name: &str| {
            let mut s = Store::open(Some(&t.path().join(name))).unwrap();
            s.set_remote(remote_at(&dir));
            s
        };
        let a = with_remote("a");
        let salt = a.key_salt(&p).unwrap();
        let on_remote = fs::read_to_string(dir.join("v1/projects/p/key-salt")).unwrap();
        assert_eq!(on_remote.trim(), crate::store::salt_to_hex(&salt));
        assert_eq!(
            with_remote("b").key_salt(&p).unwrap(),
            salt,
            "a fresh runner adopts it"
        );
        // A store with a salt of its own from before the remote.
        let c_dir = t.path().join("c");
        let own = Store::open(Some(&c_dir)).unwrap().key_salt(&p).unwrap();
        assert_ne!(own, salt);
        let c = with_remote("c");
        assert_eq!(c.key_salt(&p).unwrap(), salt, "the remote's wins");
        assert_eq!(
            Store::open(Some(&c_dir)).unwrap().key_salt(&p).unwrap(),
            salt
        );
        // Agreed once: the remote is not asked again (gone, the salt stays).
        fs::remove_dir_all(&dir).unwrap();
        assert_eq!(with_remote("c").key_salt(&p).unwrap(), salt);
        assert_ne!(
            a.key_salt(&ProjectId::new("q").unwrap()).unwrap(),
            salt,
            "per project"
        );
        // Two fresh runners at once converge on the one created first.
        let r = ProjectId::new("r").unwrap();
        let (x, y) = (with_remote("x"), with_remote("y"));
        let (sx, sy) = std::thread::scope(|s| {
            let hx = s.spawn(|| x.key_salt(&r).unwrap());
            let hy = s.spawn(|| y.key_salt(&r).unwrap());
            (hx.join().unwrap(), hy.join().unwrap())
        });
        assert_eq!(sx, sy);
    }

    /// Two stores, one remote directory: A publishes and pushes, B pulls the exact tree (modes,
    /// times, symlinks, object names); a second version moves only its new object; a second
    /// push of the key reports `exists` and changes nothing.
    #[test]
    fn push_then_pull_rebuilds_the_layer_exactly() {
        let t = tempfile::tempdir().unwrap();
        let remote = remote_at(&t.path().join("remote"));
        let a = Store::open(Some(&t.path().join("a"))).unwrap();
        let b = Store::open(Some(&t.path().join("b"))).unwrap();
        let (p, c) = (ProjectId::new("p").unwrap(), CacheId::new("npm").unwrap());
        let (k1, k2) = (CacheKey::new("k1").unwrap(), CacheKey::new("k2").unwrap());
        let up = t.path().join("upper");
        fs::create_dir_all(up.join("pkg/bin")).unwrap();
        fs::write(up.join("pkg/index.js"), "module.exports = 1").unwrap();
        fs::write(up.join("pkg/same.js"), "module.exports = 1").unwrap();
        // Same bytes, other metadata: a second object made from the same download.
        fs::write(up.join("pkg/exec.js"), "module.exports = 1").unwrap();
        fs::set_permissions(up.join("pkg/exec.js"), fs::Permissions::from_mode(0o700)).unwrap();
        fs::write(up.join("pkg/bin/run"), "#!/bin/sh\n").unwrap();
        fs::set_permissions(up.join("pkg/bin/run"), fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink("../index.js", up.join("pkg/bin/link")).unwrap();
        fs::set_permissions(up.join("pkg"), fs::Permissions::from_mode(0o750)).unwrap();
        let pub1 = a.promote_dirs(&p, &c, &k1, None, Some(&up)).unwrap();
        let pda = a.project(&p).unwrap();
        let inputs: crate::store::Inputs =
            [("key file package-lock.json".into(), "aa".into())].into();
        pda.record_inputs(&c, "k1", &inputs);
        let rep = remote.push_layer(&pda, &c, &k1, &pub1.layer).unwrap();
        assert_eq!(
            (rep.result.as_str(), rep.objects, rep.uploaded_objects),
            ("pushed", 2, 2)
        );

        let pdb = b.project(&p).unwrap();
        let found = remote
            .block_on(None, remote.find(&p, &c, &k1, &[]))
            .unwrap()
            .unwrap();
        let got = remote.pull(&b, &pdb, &c, &found).unwrap();
        assert_eq!((got.pulled_objects, got.result.as_str()), (2, "published"));
        let lb = pdb.read_key(&c, &k1).unwrap().unwrap();
        assert_eq!(lb, pub1.layer, "a pulled layer keeps its id");
        assert_eq!(
            pdb.read_inputs(&c, "k1"),
            Some(inputs),
            "its inputs came along"
        );
        assert_eq!(
            listing(&pdb.layer(&lb).tree()),
            listing(&pda.layer(&pub1.layer).tree())
        );
        let names = |pd: &crate::store::ProjectDirs| {
            let mut v: Vec<_> = pd
                .objects()
                .list()
                .unwrap()
                .into_iter()
                .map(|o| o.0.file_name().unwrap().to_owned())
                .collect();
            v.sort();
            v
        };
        assert_eq!(names(&pda), names(&pdb), "same objects, same names");

        // Version 2 on top of version 1: one new file.
        let up2 = t.path().join("upper2");
        fs::create_dir_all(&up2).unwrap();
        fs::write(up2.join("new.js"), "new").unwrap();
        let pub2 = a
            .promote_dirs(&p, &c, &k2, Some(&pub1.layer), Some(&up2))
            .unwrap();
        let rep2 = remote.push_layer(&pda, &c, &k2, &pub2.layer).unwrap();
        assert_eq!((rep2.objects, rep2.uploaded_objects), (3, 1));
        let found = remote
            .block_on(
                None,
                remote.find(
                    &p,
                    &c,
                    &CacheKey::new("k3").unwrap(),
                    &[CacheKey::new("k").unwrap()],
                ),
            )
            .unwrap()
            .unwrap();
        assert!(!found.exact);
        // A killed pull of this layer left its staging directory: the retry builds under a
        // fresh id instead of failing on it.
        fs::create_dir_all(pdb.staging().join(pub2.layer.as_str()).join("tree")).unwrap();
        let got2 = remote.pull(&b, &pdb, &c, &found).unwrap();
        assert_ne!(got2.layer, pub2.layer.as_str());
        assert_eq!((got2.pulled_objects, got2.pulled_bytes), (1, 3), "{got2:?}");
        assert_eq!(
            remote
                .push_layer(&pda, &c, &k2, &pub2.layer)
                .unwrap()
                .result,
            "exists"
        );
        // A lazy mount's access trace beside key k lives as long as the key; one whose key
        // is gone is removed.
        use object_store::ObjectStoreExt;
        let trace = remote.layout.trace(&p, &c, &k1);
        let orphan = remote.layout.trace(&p, &c, &CacheKey::new("gone").unwrap());
        remote
            .block_on(None, async {
                for t in [&trace, &orphan] {
                    remote.store.put(t, "a/b\n".into()).await.unwrap();
                }
                Ok(())
            })
            .unwrap();
        let rep = remote.gc(Duration::ZERO, false).unwrap();
        assert_eq!(
            (rep.keys, rep.removed_objects, rep.broken_keys.len()),
            (2, 0, 0)
        );
        let exists = |t| remote.block_on(None, async { Ok(remote.store.head(t).await.is_ok()) });
        assert_eq!(
            (exists(&trace).unwrap(), exists(&orphan).unwrap()),
            (true, false)
        );
    }
}
