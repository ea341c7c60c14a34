//! Lazy remote layers: a run on a runner that lacks a layer mounts it from the remote
//! manifest at once and fetches file content on first open (compare stargz and SOCI, which do
//! this for container images; docs/remote.md has the user's view).
//!
//! * The run's side ([`Remote::prepare_lazy`], in the run's process): on an exact remote hit,
//!   fetch the key record, the manifest and the key's recorded access trace, and lay out the
//!   layer's *partial* directory in the local store ([`crate::store::ProjectDirs::partial`]):
//!   `manifest.json`, `links` (its link groups, as a pulled layer has them), `replay` (the
//!   trace to replay) and `held/` (a link to every object of the layer that is local).
//! * The daemon's side ([`make_layer`], the overlay's [`crate::overlay::LayerMaker`]): a
//!   [`LazyLayer`] answers lookups, attributes, listings, symlinks and xattrs from the
//!   manifest ([`tree`]) and fetches a file's object on its first open ([`fetch`]); the trace
//!   is replayed and the rest fetched in the background. It writes what it did to the run's
//!   directory ([`LazyReport`], and the order in which the run first opened files).
//! * The end ([`Remote::finish_lazy`], in the run's process after the unmount): the run's
//!   trace is stored beside the key in the remote for the next fresh runner, and when every
//!   object is local the layer is published through the normal pull path (which now fetches
//!   nothing) — from then on it is a local layer like any other, and the partial directory
//!   goes. A run that ends first leaves its verified objects for the next.

mod fetch;
mod finish;
mod tree;

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::Remote;
use super::config::RemoteConfig;
use crate::ids::ProjectId;
use crate::overlay::{Layer, LayerDir};
use crate::store::ObjectStore as LocalObjects;
pub use fetch::Limits;
use fetch::Shared;
use tree::Tree;

/// `manifest` of a partial directory: the remote manifest as fetched (compact or JSON form:
/// `compact::parse` reads either).
pub const MANIFEST: &str = "manifest";

/// What partial directories of an earlier version hold instead of [`MANIFEST`] (JSON).
pub const OLD_MANIFEST: &str = "manifest.json";
/// `held/` of a partial directory: the verified bytes of each object of the layer that is
/// here, by hex id (a fetched file, or a link to a store object with those bytes).
pub const HELD: &str = "held";
/// `replay` of a partial directory: the access trace to replay (paths, one per line).
pub const REPLAY: &str = "replay";
/// `links` of a partial directory: the layer's link groups (`overlay::links` format).
pub const LINKS: &str = "links";
/// `lazy-report.json` in the run's directory: what the daemon fetched ([`LazyReport`]).
pub const REPORT: &str = "lazy-report.json";
/// `lazy-trace` in the run's directory: the paths of the layer's files in the order the run
/// first opened them, one per line.
pub const TRACE: &str = "lazy-trace";

/// What the overlay daemon needs to make a lazy layer ([`crate::overlay::options::MadeLower`]'s
/// spec, as JSON).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LazySpec {
    /// The remote (credentials come from the daemon's environment, as the run's).
    pub remote: RemoteConfig,
    /// The project.
    pub project: ProjectId,
    /// The layer's partial directory.
    pub dir: PathBuf,
    /// The project's objects directory.
    pub objects: PathBuf,
    /// The run's directory (where the report and the trace are written).
    pub run_dir: PathBuf,
}

/// What a lazy layer's daemon did, written to the run's directory ([`REPORT`]).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct LazyReport {
    /// Distinct objects of the layer.
    pub objects: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Objects local when the daemon ended.
    pub local_objects: u64,
    /// Their bytes.
    pub local_bytes: u64,
    /// Objects fetched by this daemon.
    pub fetched_objects: u64,
    /// Bytes fetched by this daemon.
    pub fetched_bytes: u64,
    /// GET requests sent (retries included).
    pub gets: u64,
    /// Files the run opened (each counted once).
    pub opened: u64,
    /// Every object is local.
    pub complete: bool,
    /// Why the layer must not be used again (a missing or corrupt object), if so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broken: Option<String>,
    /// Reads that got EIO, "path: why" (the first few).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<String>,
}

/// A layer served from its remote manifest, its file content fetched on first open (see the
/// module docs).
pub struct LazyLayer {
    tree: Arc<Tree>,
    shared: Arc<Shared>,
    /// Per entry: opened by this run already.
    opened: Vec<AtomicBool>,
    /// Entries in the order this run first opened them.
    trace: Mutex<Vec<u32>>,
    /// `held/`, open: what STATFS answers from (the store's filesystem).
    held: File,
    run_dir: PathBuf,
}

/// The overlay's [`crate::overlay::LayerMaker`] for [`LazySpec`]s: reads the manifest, starts
/// the fetcher (and its background replay and completion) and registers the report's writing
/// at the daemon's exit.
///
/// Errors: `EINVAL` for a spec or manifest that does not parse; the errno of opening the
/// partial directory.
pub fn make_layer(spec: &serde_json::Value) -> io::Result<Box<dyn Layer>> {
    let bad = |what: &str, e: &dyn std::fmt::Display| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("lazy layer: {what}: {e}"),
        )
    };
    let spec: LazySpec = serde_json::from_value(spec.clone()).map_err(|e| bad("spec", &e))?;
    let layer = Arc::new(LazyLayer::open(&spec).map_err(|e| bad("opening", &e))?);
    let bg = layer.clone();
    let replay = layer.replay_order(&spec.dir.join(REPLAY));
    layer.shared.spawn_background(replay);
    crate::overlay::on_daemon_exit(Box::new(move || bg.write_report()));
    // Also written every second, so a daemon killed outright leaves a recent one.
    let periodic = Arc::downgrade(&layer);
    std::thread::Builder::new()
        .name("lazy-report".into())
        .spawn(move || {
            while let Some(l) = periodic.upgrade() {
                l.write_report();
                drop(l);
                std::thread::sleep(std::time::Duration::from_secs(1));
            }
        })?;
    Ok(Box::new(ArcLayer(layer)))
}

impl LazyLayer {
    /// Reads the partial directory of `spec` and starts the fetcher.
    ///
    /// Errors: [`crate::error::Error`] reading or parsing the manifest, opening the remote.
    fn open(spec: &LazySpec) -> crate::error::Result<LazyLayer> {
        use crate::error::{Error, IoContext};
        let mpath = spec.dir.join(MANIFEST);
        let bytes = std::fs::read(&mpath).at(&mpath)?;
        let wire = super::compact::wire(&bytes)
            .map_err(|e| Error::Failed(format!("{}: {e}", mpath.display())))?;
        drop(bytes);
        let held_dir = spec.dir.join(HELD);
        let held = File::open(&held_dir).at(&held_dir)?;
        let dev = held.metadata().at(&held_dir)?;
        let tree = Tree::new(&wire, std::os::unix::fs::MetadataExt::dev(&dev))
            .map_err(|e| Error::Failed(format!("{}: {e}", mpath.display())))?;
        let tree = Arc::new(tree);
        let remote = Remote::open(spec.remote.clone())?;
        let shared = Shared::new(
            remote,
            spec.project.clone(),
            &wire,
            tree.clone(),
            LocalObjects::new(&spec.objects),
            held_dir,
            Limits::from_env(),
        )?;
        // Its 100k strings take tens of ms to free: not on the way to the mount.
        std::thread::spawn(move || drop(wire));
        let opened = (0..tree.nodes.len())
            .map(|_| AtomicBool::new(false))
            .collect();
        Ok(LazyLayer {
            tree,
            shared: Arc::new(shared),
            opened,
            trace: Mutex::new(Vec::new()),
            held,
            run_dir: spec.run_dir.clone(),
        })
    }

    /// The objects of the files `replay` lists (one path per line), in its order; an absent
    /// or unreadable file is an empty trace.
    fn replay_order(&self, replay: &Path) -> Vec<u32> {
        let Ok(text) = std::fs::read(replay) else {
            return Vec::new();
        };
        text.split(|&b| b == b'\n')
            .filter_map(|p| std::ffi::CString::new(p).ok())
            .filter_map(|p| self.tree.find(&p).ok())
            .filter_map(|i| self.tree.nodes[i as usize].object)
            .collect()
    }

    /// Writes [`REPORT`] and [`TRACE`] into the run's directory (each replaced whole).
    fn write_report(&self) {
        let (local_objects, local_bytes) = self.shared.local_count();
        let trace = self.trace.lock().clone();
        let r = LazyReport {
            objects: self.shared.len() as u64,
            bytes: self.tree.objects.iter().map(|(_, s)| s).sum(),
            local_objects,
            local_bytes,
            fetched_objects: self.shared.counts.objects.load(Relaxed),
            fetched_bytes: self.shared.counts.bytes.load(Relaxed),
            gets: self.shared.counts.gets.load(Relaxed),
            opened: trace.len() as u64,
            complete: local_objects == self.shared.len() as u64,
            broken: self.shared.broken.lock().clone(),
            failed: self.shared.failed.lock().clone(),
        };
        let mut lines = Vec::new();
        for i in trace {
            lines.extend_from_slice(&self.tree.nodes[i as usize].path);
            lines.push(b'\n');
        }
        let json = serde_json::to_vec(&r).unwrap_or_default();
        for (name, body) in [(REPORT, json), (TRACE, lines)] {
            let p = self.run_dir.join(name);
            if let Err(e) = finish::replace_file(&p, &body) {
                tracing::warn!(path = %p.display(), "writing the lazy layer's report: {e}");
            }
        }
    }
}

impl Drop for LazyLayer {
    fn drop(&mut self) {
        self.shared.stop();
    }
}

/// A [`LazyLayer`] shared with its report writers.
struct ArcLayer(Arc<LazyLayer>);

impl Layer for ArcLayer {
    fn stat(&self, rel: &CStr) -> io::Result<libc::stat> {
        let t = &self.0.tree;
        t.find(rel).map(|i| t.stat(i))
    }

    fn whited_out(&self, _rel: &CStr, _st: Option<&libc::stat>) -> io::Result<bool> {
        // A published layer is a whole tree: it records no whiteouts.
        Ok(false)
    }

    fn is_opaque(&self, _rel: &CStr) -> io::Result<bool> {
        Ok(false)
    }

    fn open(&self, rel: &CStr, _flags: libc::c_int) -> io::Result<File> {
        let l = &self.0;
        let i = l.tree.find(rel)?;
        let n = &l.tree.nodes[i as usize];
        let Some(o) = n.object else {
            let errno = match n.mode & libc::S_IFMT {
                libc::S_IFDIR => libc::EISDIR,
                libc::S_IFLNK => libc::ELOOP,
                _ => libc::ENXIO,
            };
            return Err(io::Error::from_raw_os_error(errno));
        };
        if !l.opened[i as usize].swap(true, Relaxed) {
            l.trace.lock().push(i);
        }
        l.shared.open(o, &n.path)
    }

    fn readlink(&self, rel: &CStr) -> io::Result<Vec<u8>> {
        let t = &self.0.tree;
        let i = t.find(rel)?;
        match &t.nodes[i as usize].target {
            Some(target) => Ok(target.to_vec()),
            None => Err(io::Error::from_raw_os_error(libc::EINVAL)),
        }
    }

    fn xattr(&self, rel: &CStr, name: &CStr, buf: &mut [u8]) -> io::Result<usize> {
        let t = &self.0.tree;
        let i = t.find(rel)?;
        let (_, v) = (t.nodes[i as usize].xattrs.iter())
            .find(|(n, _)| n.as_c_str() == name)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENODATA))?;
        if buf.is_empty() {
            return Ok(v.len());
        }
        if buf.len() < v.len() {
            return Err(io::Error::from_raw_os_error(libc::ERANGE));
        }
        buf[..v.len()].copy_from_slice(v);
        Ok(v.len())
    }

    fn xattr_names(&self, rel: &CStr) -> io::Result<Vec<Vec<u8>>> {
        let t = &self.0.tree;
        let i = t.find(rel)?;
        Ok((t.nodes[i as usize].xattrs.iter())
            .map(|(n, _)| n.as_bytes().to_vec())
            .collect())
    }

    fn statx(&self, rel: &CStr, _mask: u32) -> io::Result<libc::statx> {
        let t = &self.0.tree;
        t.find(rel).map(|i| t.statx(i))
    }

    fn statvfs(&self) -> io::Result<libc::statvfs> {
        crate::sys::fstatvfs(&self.0.held)
    }

    fn open_dir(&self, rel: &CStr) -> io::Result<Option<Box<dyn LayerDir>>> {
        let t = &self.0.tree;
        Ok(t.find(rel).ok().filter(|&i| t.is_dir(i)).map(|i| {
            Box::new(Dir {
                tree: t.clone(),
                dir: i,
            }) as Box<dyn LayerDir>
        }))
    }

    fn noatime_view(&self) -> io::Result<Option<(std::os::fd::OwnedFd, Box<dyn Layer>)>> {
        // Its files are the store's objects, opened by the daemon only.
        Ok(None)
    }
}

/// A directory of a [`LazyLayer`] (see [`LayerDir`]).
struct Dir {
    tree: Arc<Tree>,
    dir: u32,
}

impl LayerDir for Dir {
    fn stat(&self, name: &CStr) -> io::Result<Option<libc::stat>> {
        Ok(self.tree.child(self.dir, name).map(|i| self.tree.stat(i)))
    }

    fn marked(&self, _name: &CStr) -> io::Result<bool> {
        Ok(false)
    }

    fn is_opaque(&self, _name: &CStr) -> io::Result<bool> {
        Ok(false)
    }

    fn names(&self, _again: bool) -> io::Result<Vec<(std::ffi::OsString, u8)>> {
        Ok(self.tree.names(self.dir))
    }
}
