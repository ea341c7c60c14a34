//! The order in which a mount's READs and OPENs first reach each lower file's data: recorded
//! cheaply on the data part's open path (an fd-cache miss, so once per file in the common
//! case), written as one layer-relative path per line to a file the mount's owner names
//! ([`super::OverlayConfig::open_trace`]) every second and when the daemon ends. The store
//! stores it beside the key in the remote tier, where a fresh runner's lazy mount replays it.

use std::collections::HashSet;
use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;

/// Lower files, in the order their data was first opened (see the module docs).
pub struct OpenTrace {
    file: PathBuf,
    seen: Mutex<(HashSet<CString>, Vec<CString>)>,
}

impl OpenTrace {
    /// A trace written to `file`, every second from a thread of its own and at the daemon's
    /// exit ([`super::on_daemon_exit`]).
    ///
    /// Errors: the errno of starting the thread.
    pub fn start(file: &Path) -> std::io::Result<Arc<OpenTrace>> {
        let t = Arc::new(OpenTrace {
            file: file.to_path_buf(),
            seen: Mutex::new((HashSet::new(), Vec::new())),
        });
        let at_exit = Arc::clone(&t);
        super::on_daemon_exit(Box::new(move || at_exit.write()));
        let periodic: Weak<OpenTrace> = Arc::downgrade(&t);
        std::thread::Builder::new()
            .name("open-trace".into())
            .spawn(move || {
                let mut written = 0;
                while let Some(t) = periodic.upgrade() {
                    let n = t.seen.lock().1.len();
                    if n != written {
                        t.write();
                        written = n;
                    }
                    drop(t);
                    std::thread::sleep(Duration::from_secs(1));
                }
            })?;
        Ok(t)
    }

    /// The data of lower file `rel` is being opened (recorded the first time only).
    pub fn record(&self, rel: &CStr) {
        let mut seen = self.seen.lock();
        if !seen.0.contains(rel) {
            seen.0.insert(rel.to_owned());
            seen.1.push(rel.to_owned());
        }
    }

    /// Replaces the trace file with the paths recorded so far (a failure is logged).
    fn write(&self) {
        let mut body = Vec::new();
        for p in &self.seen.lock().1 {
            body.extend_from_slice(p.to_bytes());
            body.push(b'\n');
        }
        let tmp = self.file.with_extension("tmp");
        let r = std::fs::write(&tmp, &body).and_then(|()| std::fs::rename(&tmp, &self.file));
        if let Err(e) = r {
            tracing::warn!(path = %self.file.display(), "writing the open trace: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trace_keeps_first_opens_in_order_and_is_written_at_exit() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("trace");
        let t = OpenTrace::start(&file).unwrap();
        for p in ["b/1", "a", "b/1", "c", "a"] {
            t.record(&CString::new(p).unwrap());
        }
        t.write();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "b/1\na\nc\n");
        assert!(!file.with_extension("tmp").exists());
    }
}
