//! `layercache serve`'s pages in headless Chromium (Debian's `chromium`, driven by
//! playwright-core through tests/serve_browser/check.cjs) against a store filled by real npm
//! runs: without the token a page is the login form (401); the login URL `serve` printed logs
//! in (an HttpOnly, SameSite=Strict cookie that is not the token) and lands on a URL without
//! the token; the project page clears one key (confirmation, then the key is gone — in the store
//! too), the spec editor shows a bad preset next to its line and saves a good spec, the runs
//! page draws its chart (also on a phone-sized screen) and links each run to its own page, which
//! lists the run's preparations. Screenshots of every step are saved in
//! `$CARGO_TARGET_TMPDIR/serve-browser/`.
//!
//! Needs root, /dev/fuse, npm, chromium and playwright-core (`$LAYERCACHE_PLAYWRIGHT`, which
//! scripts/test.sh installs); a skip otherwise (a failure with `CI`). Node and chromium are
//! stopped by the pids this test started, even when it panics.

mod serve_support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serve_support::{Server, can_run, filled_store, lc_json, skip_or_fail};

/// playwright-core's directory: `$LAYERCACHE_PLAYWRIGHT`, else where scripts/test.sh puts it.
fn playwright() -> Option<PathBuf> {
    let dir = std::env::var_os("LAYERCACHE_PLAYWRIGHT")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| {
                Path::new(&h).join(".cache/layercache-test/playwright/node_modules/playwright-core")
            })
        })?;
    dir.join("package.json").is_file().then_some(dir)
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the pid exists.
    unsafe { libc::kill(pid, 0) == 0 }
}

/// The node process and the chromium it launched; Drop kills whatever is still running.
struct Browser {
    node: Child,
    chromium: Arc<Mutex<Option<i32>>>,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Drop for Browser {
    fn drop(&mut self) {
        if let Ok(None) = self.node.try_wait() {
            let _ = self.node.kill();
            let _ = self.node.wait();
        }
        if let Some(pid) = *self.chromium.lock().unwrap() {
            // playwright starts chromium as the leader of its own process group.
            // SAFETY: kill(2) of the group of the browser this test started.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
    }
}

#[test]
fn pages_in_headless_chromium() {
    if !can_run() {
        return;
    }
    let Some(pw) = playwright() else {
        skip_or_fail("needs playwright-core ($LAYERCACHE_PLAYWRIGHT; scripts/test.sh installs it)");
        return;
    };
    if !Path::new("/usr/bin/chromium").exists() {
        skip_or_fail("needs Debian's chromium (/usr/bin/chromium)");
        return;
    }
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("serve-browser");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let sb = filled_store();
    let store = sb.path("store");
    let server = Server::start(&store, &[]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/serve_browser/check.cjs");
    let mut node = Command::new("node")
        .arg(&script)
        .arg(&server.base)
        .arg(&out)
        .arg(&server.login)
        .env("LAYERCACHE_PLAYWRIGHT", &pw)
        .env("HOME", sb.path(""))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = node.stdout.take().unwrap();
    let browser = Browser {
        node,
        chromium: Arc::default(),
        lines: Arc::default(),
    };
    let (pid_slot, lines) = (browser.chromium.clone(), browser.lines.clone());
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            eprintln!("check.cjs: {line}");
            if let Some(pid) = line.strip_prefix("CHROMIUM_PID ") {
                *pid_slot.lock().unwrap() = pid.trim().parse().ok();
            }
            lines.lock().unwrap().push(line);
        }
    });
    let mut browser = browser;
    // A safety net, not a timing assertion: a hung browser must not hang the suite.
    let deadline = Instant::now() + Duration::from_secs(300);
    let status = loop {
        if let Some(s) = browser.node.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "check.cjs still running after 300 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    reader.join().unwrap();
    assert!(status.success(), "check.cjs failed: {status}");
    let lines = browser.lines.lock().unwrap().clone();
    let result: serde_json::Value = lines
        .iter()
        .find_map(|l| l.strip_prefix("RESULT "))
        .map(|j| serde_json::from_str(j).unwrap())
        .expect("a RESULT line");
    for step in ["login", "clear", "spec", "runs", "run"] {
        assert!(lines.contains(&format!("ok {step}")), "{lines:?}");
    }
    // The browser is gone (playwright closed it) — and so is the cleared key, in the store.
    let pid = browser
        .chromium
        .lock()
        .unwrap()
        .expect("a CHROMIUM_PID line");
    assert!(!alive(pid), "chromium {pid} still running");
    let cleared = result["cleared_key"].as_str().unwrap();
    let ls = lc_json(&store, &["ls"]);
    assert!(!ls.to_string().contains(cleared), "{cleared} still in {ls}");
    assert_eq!(ls.as_array().unwrap().len(), 3);
    assert!(
        std::fs::read_to_string(store.join("v1/projects/web-demo/specs/1.toml"))
            .unwrap()
            .contains("preset = \"npm\"")
    );
    assert_eq!(result["run_rows"], 8);
    // The newest run's page lists what the event log has for that run, in run order.
    let run = result["run_id"].as_str().unwrap();
    let events: Vec<serde_json::Value> = std::fs::read_to_string(store.join("events.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|e: &serde_json::Value| e["run"] == run)
        .collect();
    assert_eq!(result["run_caches"], events.len(), "{result}");
    assert_eq!(result["run_first_result"], events[0]["result"], "{result}");
    assert_eq!(result["run_first_key"], events[0]["key"], "{result}");
    assert!(
        result["run_total"].as_str().unwrap().contains("succeeded"),
        "{result}"
    );
    for name in [
        "login",
        "project",
        "confirm",
        "cleared",
        "spec-error",
        "runs",
        "runs-phone",
        "run",
        "run-900",
        "run-phone",
    ] {
        let png = std::fs::read(out.join(format!("{name}.png"))).unwrap();
        assert!(
            png.starts_with(b"\x89PNG") && png.len() > 5_000,
            "{name}.png"
        );
    }
    eprintln!("screenshots in {}", out.display());
    drop(browser);
    assert!(server.stop().success());
}
