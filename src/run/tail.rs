//! A script's output passed through to layercache's stderr while its last bytes are kept, so a
//! failed setup's own words can be kept with its logs ([`crate::store::keep_failed_logs`]).
//! Used only when stderr is not a terminal: on a terminal the script keeps the terminal itself
//! (tools draw progress bars only there), and its user has read the output already.

use std::io::{Read, Write};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

/// How much of a script's output is kept: its last 64 KiB.
pub(super) const TAIL_BYTES: usize = 64 << 10;

/// A pipe whose reader copies everything to stderr and keeps the last [`TAIL_BYTES`].
pub(super) struct Tee {
    writer: Option<std::io::PipeWriter>,
    kept: Arc<parking_lot::Mutex<Vec<u8>>>,
    done: mpsc::Receiver<()>,
}

impl Tee {
    /// Makes the pipe and starts its reader thread.
    ///
    /// Errors: the `pipe(2)` error (`EMFILE`).
    pub(super) fn start() -> std::io::Result<Tee> {
        let (mut reader, writer) = std::io::pipe()?;
        let kept = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let (tx, done) = mpsc::channel();
        let k = Arc::clone(&kept);
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            loop {
                match reader.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        let _ = std::io::stderr().write_all(&buf[..n]);
                        keep_tail(&mut k.lock(), &buf[..n], TAIL_BYTES);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            let _ = tx.send(());
        });
        Ok(Tee {
            writer: Some(writer),
            kept,
            done,
        })
    }

    /// A write end for a child's stdout or stderr.
    ///
    /// Errors: the `dup(2)` error.
    pub(super) fn stdio(&self) -> std::io::Result<Stdio> {
        match &self.writer {
            Some(w) => Ok(Stdio::from(w.try_clone()?)),
            None => Ok(Stdio::null()),
        }
    }

    /// Closes this side's write end and waits (up to `wait`: something the script left may
    /// still hold the pipe) until the reader has seen the end; returns the kept tail.
    pub(super) fn finish(mut self, wait: Duration) -> Vec<u8> {
        drop(self.writer.take());
        let _ = self.done.recv_timeout(wait);
        std::mem::take(&mut *self.kept.lock())
    }
}

/// Appends `chunk` to `tail`, keeping its last `limit` bytes.
fn keep_tail(tail: &mut Vec<u8>, chunk: &[u8], limit: usize) {
    tail.extend_from_slice(chunk);
    if tail.len() > limit {
        let cut = tail.len() - limit;
        tail.drain(..cut);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_keeps_the_last_bytes() {
        let mut t = Vec::new();
        keep_tail(&mut t, b"abcdef", 4);
        assert_eq!(t, b"cdef");
        keep_tail(&mut t, b"gh", 4);
        assert_eq!(t, b"efgh");
    }

    #[test]
    fn a_child_writing_to_the_tee_is_kept() {
        let tee = Tee::start().unwrap();
        let status = std::process::Command::new("sh")
            .args(["-c", "echo out; echo err >&2"])
            .stdout(tee.stdio().unwrap())
            .stderr(tee.stdio().unwrap())
            .status()
            .unwrap();
        assert!(status.success());
        let tail = tee.finish(Duration::from_secs(10));
        assert_eq!(String::from_utf8_lossy(&tail), "out\nerr\n");
    }
}
