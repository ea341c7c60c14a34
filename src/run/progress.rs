//! A stderr progress line while a script runs (only when stderr is a terminal).

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::fmt_bytes;
use crate::telemetry;

/// A stderr progress line (elapsed time, bytes written to the upper) while a script runs, only
/// when stderr is a terminal; stops on drop.
pub(super) struct Progress {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Progress {
    pub(super) fn start(json: bool, label: &str, upper: Option<PathBuf>) -> Progress {
        if json || !std::io::stderr().is_terminal() {
            return Progress {
                stop: None,
                thread: None,
            };
        }
        let (tx, rx) = mpsc::channel::<()>();
        let label = label.to_string();
        let thread = std::thread::spawn(move || {
            let start = Instant::now();
            let mut next_size = Instant::now() + Duration::from_secs(3);
            let mut size = None;
            while let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(Duration::from_secs(1))
            {
                if let Some(up) = &upper
                    && Instant::now() >= next_size
                {
                    size = Some(dir_bytes(up));
                    next_size = Instant::now() + Duration::from_secs(3);
                }
                let mut line = format!(
                    "\r\x1b[2Klayercache: {label}: {}",
                    telemetry::fmt_ms(start.elapsed().as_millis() as u64)
                );
                if let Some(b) = size {
                    line.push_str(&format!(", {} written", fmt_bytes(b)));
                }
                let _ = std::io::stderr().write_all(line.as_bytes());
            }
            let _ = std::io::stderr().write_all(b"\r\x1b[2K");
        });
        Progress {
            stop: Some(tx),
            thread: Some(thread),
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Apparent size of the regular files under `dir`, bytes (best effort).
fn dir_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(e.path()),
                Ok(t) if t.is_file() => total += e.metadata().map(|m| m.len()).unwrap_or(0),
                _ => {}
            }
        }
    }
    total
}
