//! `layercache run --sandbox docker` against a real Docker engine (issue 12): the npm fixture
//! misses in a first container (`npm ci` into /workspace/node_modules with
//! `--docker-arg=--network=host`), hits in a new one where `require('react')` works, and four
//! containers at once share the layer while each sees only its own writes; bad input (no
//! image, unknown image, unknown --user or spec user, no engine) is one line, exit 2, nothing
//! published.
//!
//! The engine and image come from scripts/lib-docker.sh (`DOCKER_HOST`,
//! `LAYERCACHE_TEST_IMAGE`); without them these tests skip (fail when `CI` is set). After each
//! test no container labelled with one of its run ids, no mount and no run directory is left;
//! the [`Sandbox`] unmounts whatever is left even on panic.

#[path = "common/run.rs"]
mod run_common;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use run_common::{
    BIN, Sandbox, can_mount, docker_test_image, json_summary, layer_owners, npm_workdir, show,
};

const SPEC: &str = r#"project = "docker-npm"
[[cache]]
id = "node_modules"
preset = "node_modules"
"#;

/// `layercache --store S --json run --spec SPEC --workdir W --sandbox docker --image I
/// A fresh [`Sandbox`] and the test image, when mounts and an engine holding it are here
/// (otherwise the test skips, or fails when `CI` is set).
fn docker_sandbox() -> Option<(Sandbox, String)> {
    if !can_mount() {
        return None;
    }
    Some((Sandbox::new(), docker_test_image()?))
}

/// --docker-arg=--network=host [EXTRA…] -- sh -c SCRIPT` (no `--image` when `image` is empty).
fn docker_run(sb: &Sandbox, work: &Path, image: &str, extra: &[&str], script: &str) -> Command {
    let mut flags = vec!["--sandbox", "docker"];
    if !image.is_empty() {
        flags.extend(["--image", image]);
    }
    flags.push("--docker-arg=--network=host");
    flags.extend(extra);
    sb.command(&sb.path("spec.toml"), work, &flags, &["sh", "-c", script])
}

fn result(o: &Output) -> (String, String) {
    let s = json_summary(o);
    let c = &s["caches"][0];
    (
        s["run"].as_str().unwrap().to_string(),
        c["result"].as_str().unwrap().to_string(),
    )
}

/// Containers carrying the label of run `run` (listed, never removed by this filter).
fn containers_of(run: &str) -> Vec<String> {
    let o = Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--filter",
            &format!("label=layercache.run={run}"),
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

fn assert_nothing_left(sb: &Sandbox, runs: &[String]) {
    for r in runs {
        assert!(containers_of(r).is_empty(), "run {r} left containers");
    }
    assert!(sb.mounts_below().is_empty(), "{:?}", sb.mounts_below());
}

#[test]
fn npm_fixture_misses_then_hits_in_new_containers_and_four_share_the_layer() {
    let Some((sb, image)) = docker_sandbox() else {
        return;
    };
    sb.write_spec("spec.toml", SPEC);
    let mut runs = Vec::new();

    // Run 1: miss, `npm ci` inside the container into /workspace/node_modules.
    let w1 = npm_workdir(&sb, "ws-1");
    let o = docker_run(&sb, &w1, &image, &[], "pwd && ls node_modules | wc -l")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let (run, res) = result(&o);
    assert_eq!(res, "miss", "{}", show(&o));
    runs.push(run);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("/workspace\n"),
        "COMMAND starts in /workspace: {}",
        show(&o)
    );
    assert_eq!(sb.ls().len(), 1, "one layer published");

    // Run 2, a new container and a new workdir: hit, react loads.
    let w2 = npm_workdir(&sb, "ws-2");
    let o = docker_run(
        &sb,
        &w2,
        &image,
        &[],
        "node -e \"require('react'); console.log('react ok')\"",
    )
    .output()
    .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let (run, res) = result(&o);
    assert_eq!(res, "hit", "{}", show(&o));
    runs.push(run);
    assert!(String::from_utf8_lossy(&o.stdout).contains("react ok\n"));

    // Four containers at once: each writes its own file into node_modules and sees only it.
    let children: Vec<_> = (0..4)
        .map(|i| {
            let w = npm_workdir(&sb, &format!("ws-c{i}"));
            let script = format!(
                "echo {i} > node_modules/.mine-{i} && ls -a node_modules | grep '^\\.mine-' && \
                 node -e \"require('react')\""
            );
            docker_run(&sb, &w, &image, &[], &script)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (i, c) in children.into_iter().enumerate() {
        let o = c.wait_with_output().unwrap();
        assert_eq!(o.status.code(), Some(0), "container {i}: {}", show(&o));
        let (run, res) = result(&o);
        assert_eq!(res, "hit", "{}", show(&o));
        runs.push(run);
        let lines: Vec<String> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .skip(1)
            .map(str::to_string)
            .collect();
        assert_eq!(lines, [format!(".mine-{i}")], "{}", show(&o));
    }
    assert_eq!(sb.ls().len(), 1, "still one layer");
    assert_nothing_left(&sb, &runs);
}

#[test]
fn bad_input_is_one_line_exit_2_and_nothing_is_published() {
    let Some((sb, image)) = docker_sandbox() else {
        return;
    };
    sb.write_spec("spec.toml", SPEC);
    let w = npm_workdir(&sb, "ws");
    let bad_image = "layercache-no-such-image:1";
    let cases: [(&str, &[&str], &str, Option<&str>); 5] = [
        ("", &[], "--image", None),
        (
            &image,
            &["--workdir-view", "/work:space"],
            "--workdir-view /work:space",
            None,
        ),
        (bad_image, &[], "--image", None),
        (
            &image,
            &["--user", "no-such-user"],
            "--user no-such-user",
            None,
        ),
        (
            &image,
            &[],
            "no Docker engine",
            Some("unix:///nonexistent/docker.sock"),
        ),
    ];
    for (img, extra, names, host) in cases {
        let mut cmd = docker_run(&sb, &w, img, extra, "true");
        if let Some(h) = host {
            cmd.env("DOCKER_HOST", h);
        }
        let o = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{img} {extra:?}: {}", show(&o));
        assert_eq!(err.lines().count(), 1, "{img} {extra:?}: one line: {err}");
        assert!(err.contains(names), "{img} {extra:?}: names {names}: {err}");
    }
    // A user from the spec (no --user) is named as the spec's field, not as the flag.
    sb.write_spec("spec.toml", &format!("user = \"no-such-user\"\n{SPEC}"));
    let o = docker_run(&sb, &w, &image, &[], "true").output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "spec user: {}", show(&o));
    assert_eq!(err.lines().count(), 1, "spec user: one line: {err}");
    assert!(
        err.contains("the spec's user no-such-user: no such user"),
        "{err}"
    );
    // Checked before the store is touched: no event, no project in the store.
    assert!(sb.events().is_empty(), "nothing mounted or published");
    assert!(!sb.path("store/v1/projects/docker-npm").exists());
    assert!(sb.mounts_below().is_empty());
    assert!(!w.join("node_modules").exists());
}

#[test]
fn sigterm_of_the_run_removes_its_container() {
    signal_of_the_run_removes_its_container("docker-sig", libc::SIGTERM);
}

/// `kill -9` of layercache itself: nothing of the run can clean up, so the container's
/// watchdog removes it (the docker client alone would leave it running).
#[test]
fn kill_9_of_the_run_removes_its_container() {
    signal_of_the_run_removes_its_container("docker-kill", libc::SIGKILL);
}

/// Runs a docker COMMAND that signals readiness and sleeps, sends the run `sig`, and checks
/// its container goes (at once for SIGTERM; within seconds, by the watchdog, for SIGKILL) and
/// no mount is left.
fn signal_of_the_run_removes_its_container(project: &str, sig: i32) {
    let Some((sb, image)) = docker_sandbox() else {
        return;
    };
    sb.write_spec(
        "spec.toml",
        &format!(
            "project = \"{project}\"\n[[cache]]\nid = \"s\"\nkey_files = [\"k\"]\n\
             relocatable = true\nsetup = \"echo filled > {{mount}}/f\"\n"
        ),
    );
    let w = sb.path("ws");
    std::fs::create_dir_all(&w).unwrap();
    std::fs::write(w.join("k"), "1").unwrap();
    let fifo = sb.path("ready");
    layercache::sys::mkfifo(&fifo, 0o600).unwrap();
    // COMMAND signals readiness through a fifo in the workdir, then sleeps.
    std::fs::rename(&fifo, w.join("ready")).unwrap();
    let mut child = docker_run(&sb, &w, &image, &[], "echo up > ready; exec sleep 600")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Blocks until the container opened the fifo for writing.
    let up = std::fs::read_to_string(w.join("ready")).unwrap();
    assert_eq!(up, "up\n");
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, sig) };
    let status = child.wait().unwrap();
    let mut out = String::new();
    std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut out).unwrap();
    let run =
        serde_json::from_str::<serde_json::Value>(out.lines().next().unwrap()).unwrap()["run"]
            .as_str()
            .unwrap()
            .to_string();
    if sig == libc::SIGKILL {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{out}");
        // The watchdog polls once a second; docker rm -f then takes its time.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !containers_of(&run).is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        // The run's daemon ends its mount when the run dies; wait for that too.
        while !sb.mounts_below().is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    } else {
        assert_eq!(status.code(), Some(128 + sig), "{out}");
    }
    assert_nothing_left(&sb, &[run]);
}

#[test]
fn sandbox_args_run_binds_a_layercache_mount_run_into_docker_run() {
    let Some((sb, image)) = docker_sandbox() else {
        return;
    };
    let mp = sb.path("cache/npm");
    std::fs::create_dir_all(&mp).unwrap();
    let store = sb.path("store");
    let lc = |args: &[&str]| {
        let o = Command::new(BIN)
            .arg("--store")
            .arg(&store)
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "{args:?}: {}", show(&o));
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    let out = lc(&[
        "--json",
        "mount",
        "--project",
        "p",
        "--cache",
        "npm",
        "--key",
        "k1",
        mp.to_str().unwrap(),
    ]);
    let run = serde_json::from_str::<serde_json::Value>(&out).unwrap()["run"]
        .as_str()
        .unwrap()
        .to_string();
    let words: Vec<String> = serde_json::from_str(&lc(&[
        "--json",
        "sandbox-args",
        "--driver",
        "docker",
        "--run",
        &run,
        "--workdir",
        sb.work().to_str().unwrap(),
    ]))
    .unwrap();
    let bind = format!("{0}:{0}", mp.display());
    assert!(words.contains(&bind), "{words:?}");
    let o = Command::new("docker")
        .args(["run", "--rm"])
        .args(&words)
        .arg(&image)
        .args([
            "sh",
            "-c",
            &format!("echo from-docker > {}/x", mp.display()),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", show(&o));
    assert_eq!(
        std::fs::read_to_string(mp.join("x")).unwrap(),
        "from-docker\n"
    );
    lc(&["umount", &run]);
    assert!(sb.mounts_below().is_empty());
    let o = Command::new(BIN)
        .arg("--store")
        .arg(&store)
        .args(["sandbox-args", "--driver", "docker", "--run", "no-such-run"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--run no-such-run"));
}

#[test]
fn user_1000_changes_a_root_filled_node_modules_and_1001_reuses_a_layer_1000_filled() {
    let Some((sb, image)) = docker_sandbox() else {
        return;
    };
    sb.write_spec(
        "spec.toml",
        "project = \"docker-user\"\n[[cache]]\nid = \"node_modules\"\npreset = \"node_modules\"\n\
         [[cache]]\nid = \"npm\"\nkey_files = [\"package-lock.json\"]\nrelocatable = true\n\
         setup = \"id -u > {mount}/filled-by && mkdir -p {mount}/d && echo a > {mount}/d/f\"\n",
    );
    // The npm cache's view path (below the sandbox's mount root), as $C in the scripts.
    let c = sb.path("cache/npm").display().to_string();
    let with_c = |script: &str| format!("C={c}; {script}");
    let mut runs = Vec::new();
    // Run 1 as root: node_modules filled by root (npm ci); the npm cache too.
    let w1 = npm_workdir(&sb, "ws-1");
    let o = docker_run(&sb, &w1, &image, &[], "id -u").output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    runs.push(result(&o).0);
    // Run 2 as 1000:1000: creates, edits and removes files in both, and npm install works.
    let w2 = npm_workdir(&sb, "ws-2");
    // The workspace is the user's (a platform gives the agent its own checkout).
    for p in [
        w2.clone(),
        w2.join("package.json"),
        w2.join("package-lock.json"),
    ] {
        std::os::unix::fs::chown(&p, Some(1000), Some(1000)).unwrap();
    }
    let script = "set -e; id -u; echo new > $C/new; echo more >> $C/d/f; \
                  rm $C/filled-by; echo x > node_modules/react/x; \
                  echo '//' >> node_modules/react/index.js; rm -r node_modules/express; \
                  npm install --no-audit --no-fund is-number@7.0.0 >&2; \
                  node -e \"require('react'); console.log(require('is-number')(7))\"; \
                  cat $C/d/f";
    let o = docker_run(&sb, &w2, &image, &["--user", "1000:1000"], &with_c(script))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    runs.push(result(&o).0);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("\n1000\ntrue\na\nmore\n"), "{}", show(&o));
    assert!(
        !w2.join("node_modules").exists()
            || std::fs::read_dir(w2.join("node_modules"))
                .unwrap()
                .next()
                .is_none()
    );

    // A layer filled by uid 1000 (a new key) is used read-write by uid 1001.
    let w3 = npm_workdir(&sb, "ws-3");
    std::fs::write(
        w3.join("package-lock.json"),
        "{\"lockfileVersion\":3,\"x\":1}",
    )
    .unwrap();
    std::fs::write(
        w3.join("package.json"),
        "{\"name\":\"u\",\"version\":\"1.0.0\"}",
    )
    .unwrap();
    let o = docker_run(
        &sb,
        &w3,
        &image,
        &["--user", "1000:1000"],
        &with_c("cat $C/filled-by"),
    )
    .output()
    .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    runs.push(result(&o).0);
    assert!(String::from_utf8_lossy(&o.stdout).ends_with("1000\n"));
    let o = docker_run(
        &sb,
        &w3,
        &image,
        &["--user", "1001:1001"],
        &with_c("set -e; echo b >> $C/d/f; rm $C/filled-by; touch $C/mine; ls $C"),
    )
    .output()
    .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let s = json_summary(&o);
    assert!(
        s["caches"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["result"] == "hit"),
        "{}",
        show(&o)
    );
    runs.push(s["run"].as_str().unwrap().to_string());
    // Every published layer — node_modules filled by a root `npm ci` (the tarballs' owners,
    // e.g. 501:20, in the upper), the npm cache filled by uid 0 and then by uid 1000 through
    // the mapped overlay — holds the canonical owner 0:0 only.
    let owners = layer_owners(&sb);
    assert!(owners.len() >= 6, "{owners:?}");
    let odd: Vec<_> = owners.iter().filter(|o| (o.0, o.1) != (0, 0)).collect();
    assert!(odd.is_empty(), "{odd:?}");
    assert_nothing_left(&sb, &runs);
}

/// An engine that cannot see the run's mounts: layercache runs in a private mount namespace
/// (`unshare -m --propagation private`), so its overlay mounts never reach dockerd's namespace
/// and `-v` binds the empty directory below them — what a dockerd in another mount namespace
/// without shared propagation, or a remote engine, does. The setup container's prologue finds
/// no layercache mount at the view path: one line naming it, exit 2, nothing published, no run
/// left.
#[test]
fn an_engine_that_cannot_see_the_mount_is_one_line_exit_2_and_nothing_is_published() {
    if !can_mount() {
        return;
    }
    let Some(image) = docker_test_image() else {
        return;
    };
    if !run_common::have_tool("unshare") {
        return;
    }
    let sb = Sandbox::new();
    sb.write_spec(
        "spec.toml",
        "project = \"docker-unseen\"\n[[cache]]\nid = \"s\"\nkey_files = [\"k\"]\n\
         relocatable = true\nsetup = \"echo filled > {mount}/f\"\n",
    );
    let w = sb.path("ws");
    std::fs::create_dir_all(&w).unwrap();
    std::fs::write(w.join("k"), "1").unwrap();
    let inner = docker_run(&sb, &w, &image, &[], "true");
    let o = Command::new("unshare")
        .args(["-m", "--propagation", "private"])
        .arg(inner.get_program())
        .args(inner.get_args())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    // One line of diagnosis after the line announcing the setup.
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| !l.contains(", running setup: "))
        .collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    let view = sb.path("cache/s");
    assert!(
        err.contains("cannot see the cache mount") && err.contains(&*view.to_string_lossy()),
        "{err}"
    );
    let project = sb.path("store/v1/projects/docker-unseen");
    let keys = std::fs::read_dir(project.join("caches/s/keys")).map_or(0, |d| d.count());
    assert_eq!(keys, 0, "nothing published");
    assert!(sb.ls().is_empty(), "no layer");
    let runs = std::fs::read_dir(project.join("runs")).map_or(0, |d| d.count());
    assert_eq!(runs, 0, "no run left");
    let fills = std::fs::read_dir(project.join("caches/s/fills")).map_or(0, |d| d.count());
    assert_eq!(fills, 0, "no fill lock left");
    assert!(sb.mounts_below().is_empty());
    // The same spec with the engine seeing the mount fills and publishes it.
    let script = format!("cat {}/f", view.display());
    let o = docker_run(&sb, &w, &image, &[], &script).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).ends_with("filled\n"),
        "{}",
        show(&o)
    );
    assert_eq!(result(&o).1, "miss");
    assert_nothing_left(&sb, &[result(&o).0]);
}
