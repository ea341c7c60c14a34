//! What a run says while a script runs: on a terminal a progress line that redraws (elapsed
//! time, bytes written to the upper), otherwise a plain heartbeat line every
//! [`heartbeat_every`] (10 s; CI logs and agents' captured stderr get no control characters);
//! nothing with `--json`.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::fmt_bytes;
use crate::telemetry;

/// The heartbeat's period when stderr is not a terminal: 10 s, or `LAYERCACHE_PROGRESS_SECS`
/// (whole seconds ≥ 1; anything else is ignored) — a test's knob, not a user setting.
pub(super) fn heartbeat_every() -> Duration {
    let secs = std::env::var("LAYERCACHE_PROGRESS_SECS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|s| *s >= 1)
        .unwrap_or(10);
    Duration::from_secs(secs)
}

/// One heartbeat line (no newline): `layercache: <label> running for <elapsed>[, <bytes>
/// written]`, `label` being `<cache id>: setup` or `<cache id>: maintenance`; `bytes` is the
/// apparent size of the upper, when measured.
pub(super) fn heartbeat_line(label: &str, elapsed_ms: u64, bytes: Option<u64>) -> String {
    let mut line = format!(
        "layercache: {label} running for {}",
        telemetry::fmt_ms(elapsed_ms)
    );
    if let Some(b) = bytes {
        line.push_str(&format!(", {} written", fmt_bytes(b)));
    }
    line
}

/// The line said before a cache's script starts (no newline), e.g. `layercache: node_modules:
/// miss (no layer to restore from), running setup: npm ci --no-audit --no-fund`. `result` is what the
/// mount found, `matched` the key of the layer a restore starts from, `what` `setup` or
/// `maintenance`; the script is shown by the branch it takes in `workdir` when it has the
/// presets' `if [ -f LOCKFILE ]` form ([`chosen_branch`]), else by its first non-blank line,
/// cut at 100 characters (`…` marks a cut or more lines).
pub(super) fn start_line(
    cache: &str,
    result: telemetry::CacheResult,
    matched: Option<&str>,
    what: &str,
    script: &str,
    workdir: &Path,
) -> String {
    use telemetry::CacheResult;
    let found = match (result, matched) {
        (CacheResult::Hit, _) => "hit".to_string(),
        (CacheResult::Restore, Some(m)) => format!("restore from the layer of key {m}"),
        (CacheResult::Restore, None) => "restore".to_string(),
        (CacheResult::Miss, _) => "miss (no layer to restore from)".to_string(),
    };
    let (first, more) = match chosen_branch(script, workdir) {
        Some(branch) => (branch, false),
        None => {
            let mut lines = script.lines().map(str::trim).filter(|l| !l.is_empty());
            let first = lines.next().unwrap_or("").to_string();
            (first, lines.next().is_some())
        }
    };
    let mut shown: String = first.chars().take(100).collect();
    if shown.len() < first.len() || more {
        shown.push('…');
    }
    format!("layercache: {cache}: {found}, running {what}: {shown}")
}

/// The command a script of the presets' form `if [ -f A ]; then X; elif [ -f B ]; then Y;
/// else Z; fi` runs in `workdir` (the scripts' working directory): the branch of the first
/// file that exists there, else the `else` branch. `None` for a script of another form (or
/// an `else` that does not end the script with `; fi`): it is then shown as written.
pub(super) fn chosen_branch(script: &str, workdir: &Path) -> Option<String> {
    let mut rest = script.trim().strip_prefix("if ")?;
    loop {
        let (cond, after) = rest.split_once("; then ")?;
        let file = cond.strip_prefix("[ -f ")?.strip_suffix(" ]")?;
        let (at, end) = ["; elif ", "; else ", "; fi"]
            .into_iter()
            .filter_map(|e| after.find(e).map(|at| (at, e)))
            .min()?;
        if workdir.join(file).is_file() {
            return Some(after[..at].trim().to_string());
        }
        let next = &after[at + end.len()..];
        match end {
            "; elif " => rest = next,
            "; else " => return Some(next.trim_end().strip_suffix("; fi")?.trim().to_string()),
            _ => return None,
        }
    }
}

/// A stderr progress line (elapsed time, bytes written to the upper) while a script runs:
/// redrawn every second on a terminal, a plain line every [`heartbeat_every`] otherwise,
/// nothing with `--json`; stops on drop.
pub(super) struct Progress {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Progress {
    pub(super) fn start(json: bool, label: &str, upper: Option<PathBuf>) -> Progress {
        if json {
            return Progress {
                stop: None,
                thread: None,
            };
        }
        let terminal = std::io::stderr().is_terminal();
        let (tx, rx) = mpsc::channel::<()>();
        let label = label.to_string();
        let tick = if terminal {
            Duration::from_secs(1)
        } else {
            heartbeat_every()
        };
        let thread = std::thread::spawn(move || {
            let start = Instant::now();
            let mut next_size = Instant::now() + Duration::from_secs(3);
            let mut size = None;
            while let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(tick) {
                if let Some(up) = &upper
                    && (!terminal || Instant::now() >= next_size)
                {
                    size = Some(dir_bytes(up));
                    next_size = Instant::now() + Duration::from_secs(3);
                }
                let line = heartbeat_line(&label, start.elapsed().as_millis() as u64, size);
                let line = if terminal {
                    format!("\r\x1b[2K{line}")
                } else {
                    format!("{line}\n")
                };
                let _ = std::io::stderr().write_all(line.as_bytes());
            }
            if terminal {
                let _ = std::io::stderr().write_all(b"\r\x1b[2K");
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_heartbeat_names_the_step_its_time_and_what_it_wrote() {
        assert_eq!(
            heartbeat_line("npm: setup", 20_400, Some(3 << 20)),
            "layercache: npm: setup running for 20.4 s, 3.0 MiB written"
        );
        assert_eq!(
            heartbeat_line("npm: maintenance", 500, None),
            "layercache: npm: maintenance running for 500 ms"
        );
    }

    #[test]
    fn the_start_line_says_what_was_found_and_what_runs() {
        use crate::store::MountResult::*;
        assert_eq!(
            start_line(
                "node_modules",
                Miss,
                None,
                "setup",
                "npm ci\n",
                Path::new("/nonexistent")
            ),
            "layercache: node_modules: miss (no layer to restore from), running setup: npm ci"
        );
        assert_eq!(
            start_line(
                "npm",
                Restore,
                Some("npm-v1-abc"),
                "setup",
                "\n  npm ci\nnpm prune",
                Path::new("/nonexistent")
            ),
            "layercache: npm: restore from the layer of key npm-v1-abc, running setup: npm ci…"
        );
        let long = "x".repeat(150);
        let line = start_line(
            "c",
            Hit,
            Some("k"),
            "maintenance",
            &long,
            Path::new("/nonexistent"),
        );
        assert!(line.ends_with(&format!("hit, running maintenance: {}…", "x".repeat(100))));
    }

    /// A preset's lockfile if-chain is shown by the branch the workdir's lockfile picks.
    #[test]
    fn a_lockfile_chain_is_shown_by_the_branch_it_takes() {
        let script = "if [ -f pnpm-lock.yaml ]; then pnpm install --frozen-lockfile; \
                      elif [ -f yarn.lock ]; then yarn install; else npm ci --no-audit; fi";
        let d = tempfile::tempdir().unwrap();
        let chosen = |d: &Path| chosen_branch(script, d);
        assert_eq!(chosen(d.path()).as_deref(), Some("npm ci --no-audit"));
        std::fs::write(d.path().join("yarn.lock"), "").unwrap();
        assert_eq!(chosen(d.path()).as_deref(), Some("yarn install"));
        std::fs::write(d.path().join("pnpm-lock.yaml"), "").unwrap();
        assert_eq!(
            chosen(d.path()).as_deref(),
            Some("pnpm install --frozen-lockfile")
        );
        assert_eq!(
            chosen_branch("if mountpoint -q x; then a; fi", d.path()),
            None
        );
        assert_eq!(chosen_branch("npm ci", d.path()), None);
        // A multi-line else is not resolved: the script is shown as written.
        assert_eq!(
            chosen_branch(
                "if [ -f a ]; then x; else\ny\nfi",
                Path::new("/nonexistent")
            ),
            None
        );
        let line = start_line(
            "node_modules",
            crate::store::MountResult::Miss,
            None,
            "setup",
            script,
            d.path(),
        );
        assert!(
            line.ends_with("running setup: pnpm install --frozen-lockfile"),
            "{line}"
        );
    }
}
