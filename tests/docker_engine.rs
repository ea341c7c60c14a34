//! The real Docker engine the tests use (issue 12): a layercache overlay mount bound into a
//! container with `-v` is read and written through by the container (the daemon can see the
//! FUSE mount: `allow_other`), and a container with `--network host` installs from the npm
//! registry into such a mount.
//!
//! The engine and image come from scripts/lib-docker.sh (sourced by scripts/test.sh):
//! `DOCKER_HOST` names the engine (a `dockerd` of its own when none was running) and
//! `LAYERCACHE_TEST_IMAGE` the Debian image with nodejs, npm, python3 and python3-venv made
//! with mmdebstrap + `docker import`. Without them these tests skip (fail when `CI` is set).
//! Every container runs with `--rm` and a name, and sits in a [`Container`] guard that removes
//! it even when the test panics.

#[macro_use]
mod common;

use std::process::{Command, Output};

use common::*;

/// A container name; Drop removes the container (`docker rm -f`) if `--rm` has not already.
struct Container(String);

impl Container {
    fn new(test: &str) -> Container {
        Container(format!("layercache-test-{test}-{}", std::process::id()))
    }

    /// `docker run --rm --name NAME ARGS…`; the output, whatever the status.
    fn run(&self, args: &[&str]) -> Output {
        let out = Command::new("docker")
            .args(["run", "--rm", "--name", &self.0])
            .args(args)
            .output()
            .expect("spawn docker");
        eprintln!(
            "docker run: {}\n--stdout--\n{}\n--stderr--\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rm", "-f", &self.0]).output();
    }
}

#[test]
fn container_reads_and_writes_a_layercache_mount_bound_with_v() {
    require_root!();
    let Some(image) = docker_test_image() else {
        return;
    };
    let fx = Fixture::new(|l| {
        write(&l.join("pkg/index.js"), "module.exports = 42;\n");
        write(&l.join("pkg/README"), "lower\n");
    });
    let bind = format!("{}:/cache/npm", fx.mnt.display());
    let c = Container::new("rw");
    let out = c.run(&[
        "-v",
        &bind,
        &image,
        "sh",
        "-c",
        "cat /cache/npm/pkg/index.js && echo new > /cache/npm/new.txt \
         && echo changed >> /cache/npm/pkg/README && rm /cache/npm/pkg/index.js \
         && ls /cache/npm/pkg",
    ]);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "module.exports = 42;\nREADME\n"
    );
    // The host's view of the mount and its upper hold the container's writes; the lower is
    // checked unchanged by the fixture's Drop.
    assert_eq!(read(&fx.p("new.txt")), "new\n");
    assert_eq!(read(&fx.p("pkg/README")), "lower\nchanged\n");
    assert_eq!(names(&fx.p("pkg")), ["README"]);
    assert_eq!(read(&fx.upper.join("new.txt")), "new\n");
    assert!(is_whiteout(&fx.upper.join("pkg/index.js")));
}

#[test]
fn container_with_network_host_installs_from_the_npm_registry_into_a_mount() {
    require_root!();
    let Some(image) = docker_test_image() else {
        return;
    };
    let fx = Fixture::new(|l| {
        write(
            &l.join("package.json"),
            r#"{"name":"docker-probe","version":"1.0.0","private":true,"dependencies":{"is-number":"7.0.0"}}"#,
        );
    });
    let bind = format!("{}:/workspace", fx.mnt.display());
    let c = Container::new("npm");
    let out = c.run(&[
        "--network",
        "host",
        "-v",
        &bind,
        "-w",
        "/workspace",
        &image,
        "sh",
        "-c",
        "npm install --no-audit --no-fund >&2 && node -e \"console.log(require('is-number')(7))\"",
    ]);
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "true\n");
    assert!(
        fx.upper
            .join("node_modules/is-number/package.json")
            .is_file(),
        "the install did not land in the mount's upper"
    );
}
