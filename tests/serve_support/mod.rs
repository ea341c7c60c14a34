//! Helpers of the `layercache serve` tests (tests/serve_api.rs, tests/serve_browser.rs),
//! included with `mod serve_support;`:
//!
//! * [`filled_store`]: a [`Sandbox`] whose store was filled by real `layercache run`s of the
//!   small npm fixture in tests/serve_fixture (two caches, `node_modules` and `npm`; a miss, a
//!   hit, then the lockfile of tests/serve_fixture/v2: a restore and a hit, so each cache has
//!   two keys);
//! * [`Server`]: `layercache serve --listen 127.0.0.1:0` on a store; ready once it printed its
//!   address and login line (no sleeping), whose token it keeps ([`Server::request`] and
//!   [`Server::get_json`] send it); Drop stops it by its pid (SIGTERM, SIGKILL as the last
//!   resort);
//! * [`request`]: one HTTP/1.1 request over a real TCP connection, with only the headers given;
//! * [`test_user`]: an unprivileged user of this host (made with `useradd` when missing), for
//!   requests made as another local user.

#![allow(dead_code)] // each test binary uses a different subset

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

#[path = "../common/run.rs"]
pub mod run_common;

// run.rs includes mounts.rs privately; the in-use test needs its Mounted guard.
#[allow(clippy::duplicate_mod)]
#[path = "../common/mounts.rs"]
pub mod mounts;

#[allow(unused_imports)] // each test binary uses a different subset
pub use run_common::{BIN, Sandbox, can_mount, have_tool, run_ok, skip_or_fail};

/// The project the fixture's spec declares.
pub const PROJECT: &str = "web-demo";

/// The fixture's spec: the installed tree and npm's download cache.
pub const SPEC: &str = r#"project = "web-demo"

[[cache]]
id = "node_modules"
preset = "node_modules"

[[cache]]
id = "npm"
preset = "npm"
"#;

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/serve_fixture")
        .join(rel)
}

/// Whether the store tests can run here (root, /dev/fuse, npm); otherwise a skip (a failure
/// with `CI`).
pub fn can_run() -> bool {
    can_mount() && have_tool("npm")
}

/// A sandbox whose store holds the layers of four real runs (see the module docs).
pub fn filled_store() -> Sandbox {
    let sb = Sandbox::new();
    for f in ["package.json", "package-lock.json"] {
        std::fs::copy(fixture(f), sb.work().join(f)).unwrap();
    }
    let spec = sb.write_spec("spec.toml", SPEC);
    let check = "node -e \"require('is-number'); console.log(require('ms')('2h'))\"";
    for round in 0..4 {
        if round == 2 {
            for f in ["package.json", "package-lock.json"] {
                std::fs::copy(fixture(&format!("v2/{f}")), sb.work().join(f)).unwrap();
            }
        }
        let out = sb.run(&spec, Some(check));
        assert_eq!(out.status.code(), Some(0), "run {round} failed");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "7200000");
    }
    let results: Vec<String> = sb
        .events()
        .iter()
        .map(|e| {
            format!(
                "{}:{}",
                e["cache"].as_str().unwrap(),
                e["result"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(results.len(), 8, "{results:?}");
    sb
}

/// A running `layercache serve`; Drop stops it (SIGTERM, then SIGKILL) by its pid.
pub struct Server {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// The login URL it printed (`http://127.0.0.1:PORT/login?token=…` for the store's token).
    pub login: String,
    /// The store's token, from the login URL (`None` with `--token-file`).
    pub token: Option<String>,
    /// The token file it named (`--json` only).
    pub token_file: Option<PathBuf>,
    /// stdout's lines after the first ones (kept so that the reader thread can run on).
    _lines: Receiver<String>,
}

/// Starts `layercache serve` on `store`; a thread reads its stdout into the channel.
fn spawn(store: &Path, json: bool, extra: &[&str]) -> (Child, Receiver<String>) {
    spawn_on(store, "127.0.0.1:0", json, extra)
}

/// [`spawn`] listening on `listen`.
fn spawn_on(store: &Path, listen: &str, json: bool, extra: &[&str]) -> (Child, Receiver<String>) {
    let mut cmd = Command::new(BIN);
    cmd.arg("--store").arg(store);
    if json {
        cmd.arg("--json");
    }
    let mut child = cmd
        .args(["serve", "--listen", listen])
        .args(extra)
        .env("LAYERCACHE_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

/// The next stdout line of the server being started; a failure (the child killed) when it
/// exits first or prints nothing for 60 s — a safety net against a hang, not a timing check.
fn next_line(child: &mut Option<Child>, lines: &Receiver<String>) -> String {
    match lines.recv_timeout(Duration::from_secs(60)) {
        Ok(line) => line,
        Err(e) => fail(child, &format!("serve printed no line ({e})")),
    }
}

/// Kills and reaps the server being started, then panics with `msg`.
fn fail(child: &mut Option<Child>, msg: &str) -> ! {
    let status = child.as_mut().map(|c| {
        let _ = c.kill();
        c.wait()
    });
    panic!("layercache serve: {msg} (exit: {status:?})");
}

impl Server {
    /// `layercache --store STORE --json serve --listen 127.0.0.1:0 EXTRA…`, ready once it
    /// printed its JSON line (`listen`, `login`, `token_file`).
    pub fn start(store: &Path, extra: &[&str]) -> Server {
        Server::start_on(store, "127.0.0.1:0", extra)
    }

    /// [`Server::start`] with `--listen LISTEN` (`[::1]:0`, say).
    pub fn start_on(store: &Path, listen: &str, extra: &[&str]) -> Server {
        let (child, lines) = spawn_on(store, listen, true, extra);
        let mut child = Some(child);
        let line = next_line(&mut child, &lines);
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        let (Some(url), Some(login)) = (v["listen"].as_str(), v["login"].as_str()) else {
            fail(&mut child, &format!("no listen and login URLs in {line:?}"));
        };
        let mut server = Server::new(child.take().unwrap(), lines, url, login);
        server.token_file = v["token_file"].as_str().map(PathBuf::from);
        server
    }

    /// `layercache --store STORE serve --listen 127.0.0.1:0 EXTRA…` (text output), ready once
    /// it printed its two lines (`layercache: serving STORE on URL`, then the login line), which
    /// are returned with it.
    pub fn start_text(store: &Path, extra: &[&str]) -> (Server, [String; 2]) {
        let (child, lines) = spawn(store, false, extra);
        let mut child = Some(child);
        let first = next_line(&mut child, &lines);
        let second = next_line(&mut child, &lines);
        let url = first
            .rsplit(' ')
            .next()
            .filter(|u| u.starts_with("http://"));
        // `layercache: log in at URL (…)` or `… (Authorization: Bearer, or log in at URL)`.
        let login = second
            .split_whitespace()
            .map(|w| w.trim_end_matches(')'))
            .find(|w| w.starts_with("http://") && w.contains("/login"));
        let (Some(url), Some(login)) = (url, login) else {
            fail(
                &mut child,
                &format!("no address and login URL in {first:?} {second:?}"),
            );
        };
        let server = Server::new(child.take().unwrap(), lines, url, login);
        (server, [first, second])
    }

    fn new(child: Child, lines: Receiver<String>, url: &str, login: &str) -> Server {
        let base = url.trim_end_matches('/').to_string();
        let mut server = Server {
            addr: base.trim_start_matches("http://").to_string(),
            base,
            login: login.to_string(),
            token: login.split_once("?token=").map(|(_, t)| t.to_string()),
            token_file: None,
            child,
            _lines: lines,
        };
        if !server.login.starts_with(&format!("{}/login", server.base)) {
            let msg = format!("login URL {} is not on {}", server.login, server.base);
            server.terminate(libc::SIGKILL);
            panic!("{msg}");
        }
        server
    }

    /// [`request`] with the store's token as `Authorization: Bearer` (when there is one).
    pub fn request(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
        let bearer = self.token.as_ref().map(|t| format!("Bearer {t}"));
        let mut all: Vec<(&str, &str)> = headers.to_vec();
        if let Some(b) = &bearer {
            all.push(("Authorization", b));
        }
        request(&self.addr, method, path, &all, body)
    }

    /// `GET path` with the token, expecting JSON.
    pub fn get_json(&self, path: &str) -> (u16, serde_json::Value) {
        let r = self.request("GET", path, &[], b"");
        (r.status, r.json())
    }

    /// The server's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn stop(self) -> ExitStatus {
        self.stop_with(libc::SIGTERM)
    }

    /// Sends `signal` and waits for the exit status (SIGKILL after 20 s).
    pub fn stop_with(mut self, signal: i32) -> ExitStatus {
        self.terminate(signal)
    }

    fn terminate(&mut self, signal: i32) -> ExitStatus {
        if let Ok(Some(s)) = self.child.try_wait() {
            return s;
        }
        // SAFETY: kill(2) on the pid of our own child, which has not been reaped yet.
        unsafe { libc::kill(self.child.id() as i32, signal) };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(s)) = self.child.try_wait() {
                return s;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        self.child.wait().unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.terminate(libc::SIGTERM);
    }
}

/// An HTTP response.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{}: not JSON ({e}): {}", self.status, self.text()))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One request over a new TCP connection (`Connection: close`), headers as given plus Host
/// and Content-Length.
pub fn request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Resp {
    let mut s = TcpStream::connect(addr).unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    // A server that refuses a body (413) may answer and close before reading all of it.
    let _ = s.write_all(body);
    let mut raw = Vec::new();
    if let Err(e) = s.read_to_end(&mut raw) {
        assert!(
            !raw.is_empty(),
            "reading the response of {method} {path}: {e}"
        );
    }
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a complete response head");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .expect("a status line");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    if chunked {
        body = dechunk(&body);
    }
    Resp {
        status,
        headers,
        body,
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(end) = b.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size_text = String::from_utf8_lossy(&b[..end]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16).unwrap();
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[end + 2..end + 2 + size]);
        b = &b[end + 2 + size + 2..];
    }
}

/// `GET path` expecting JSON, without credentials.
pub fn get_json(addr: &str, path: &str) -> (u16, serde_json::Value) {
    let r = request(addr, "GET", path, &[], b"");
    (r.status, r.json())
}

/// `layercache --store STORE --json ARGS…`, parsed.
pub fn lc_json(store: &Path, args: &[&str]) -> serde_json::Value {
    let out = run_ok(
        Command::new(BIN)
            .arg("--store")
            .arg(store)
            .arg("--json")
            .args(args),
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// An unprivileged user of this host for the tests (`lcserve`, made with `useradd` when
/// missing, no home): `(uid, gid)`.
pub fn test_user() -> (u32, u32) {
    const NAME: &str = "lcserve";
    let id = |flag: &str| Command::new("id").args([flag, NAME]).output();
    if !id("-u").is_ok_and(|o| o.status.success()) {
        // A concurrent test may have made it meanwhile: only its existence matters.
        let _ = Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "-s",
                "/usr/sbin/nologin",
                NAME,
            ])
            .output();
    }
    let num = |flag: &str| -> u32 {
        let o = run_ok(Command::new("id").args([flag, NAME]));
        String::from_utf8_lossy(&o.stdout).trim().parse().unwrap()
    };
    let ids = (num("-u"), num("-g"));
    assert_ne!(ids.0, 0, "{NAME} is root");
    ids
}

/// `ARGV…` as `user` with no supplementary groups and no capabilities (`setpriv`).
pub fn as_user(user: (u32, u32), argv: &[&str]) -> std::process::Output {
    Command::new("setpriv")
        .arg(format!("--reuid={}", user.0))
        .arg(format!("--regid={}", user.1))
        .args(["--clear-groups", "--inh-caps=-all", "--"])
        .args(argv)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .output()
        .unwrap()
}
