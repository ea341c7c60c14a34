//! Sandboxes for setup, maintenance and COMMAND: the arguments a platform adds to its own
//! bubblewrap or `docker run` (`layercache sandbox-args`), and the bubblewrap runner used by
//! `layercache run --sandbox bwrap`.
//!
//! Docker: the cache mounts must exist before the container starts and be mounted with
//! `allow_other` (layercache's overlay always is), so the daemon can bind them:
//! `docker run $(eval echo $(layercache sandbox-args --driver docker --spec S)) IMAGE …` gives
//! `-v /cache/<id>:/cache/<id>` per cache, `-v <workdir>:<workdir> -w <workdir>` and `-e K=V`.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Error, Result};

/// A sandbox driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    /// bubblewrap (`bwrap`).
    Bwrap,
    /// `docker run`.
    Docker,
}

impl Driver {
    /// Parses `bwrap` or `docker`. Errors: [`Error::Invalid`] naming `--driver`.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "bwrap" | "bubblewrap" => Ok(Driver::Bwrap),
            "docker" => Ok(Driver::Docker),
            _ => Err(Error::invalid(format!(
                "--driver: unknown driver {s:?} (use bwrap or docker)"
            ))),
        }
    }
}

/// What a sandbox must see: the project directory, every cache mount (read-write) and the
/// presets' environment.
#[derive(Debug, Clone, Default)]
pub struct Binds {
    /// The project directory (bound read-write, the working directory inside).
    pub workdir: PathBuf,
    /// Cache mountpoints (bound read-write at the same path).
    pub mounts: Vec<PathBuf>,
    /// Environment variables set inside.
    pub env: BTreeMap<String, String>,
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// The bind and env arguments for `driver` (without the base sandbox a platform already has).
pub fn args(driver: Driver, binds: &Binds) -> Vec<String> {
    let mut out = Vec::new();
    match driver {
        Driver::Bwrap => {
            out.extend(["--bind".into(), s(&binds.workdir), s(&binds.workdir)]);
            for m in sorted(&binds.mounts) {
                out.extend(["--bind".into(), s(&m), s(&m)]);
            }
            for (k, v) in &binds.env {
                out.extend(["--setenv".into(), k.clone(), v.clone()]);
            }
            out.extend(["--chdir".into(), s(&binds.workdir)]);
        }
        Driver::Docker => {
            out.extend([
                "-v".into(),
                format!("{}:{}", s(&binds.workdir), s(&binds.workdir)),
            ]);
            for m in sorted(&binds.mounts) {
                out.extend(["-v".into(), format!("{}:{}", s(&m), s(&m))]);
            }
            for (k, v) in &binds.env {
                out.extend(["-e".into(), format!("{k}={v}")]);
            }
            out.extend(["-w".into(), s(&binds.workdir)]);
        }
    }
    out
}

/// Parents before children, so a mount inside the workdir (node_modules) is bound on top.
fn sorted(mounts: &[PathBuf]) -> Vec<PathBuf> {
    let mut m = mounts.to_vec();
    m.sort_by_key(|p| (p.components().count(), p.clone()));
    m
}

/// Quotes `words` for a POSIX shell, space-separated (shlex).
///
/// Errors: [`Error::Invalid`] when a word holds a NUL byte, which no shell word can.
pub fn shell_quote(words: &[String]) -> Result<String> {
    shlex::try_join(words.iter().map(String::as_str))
        .map_err(|e| Error::invalid(format!("cannot quote for a shell: {e}")))
}

/// A `bwrap` command running `argv` in a sandbox: the host root read-only, fresh `/dev`,
/// `/proc` and `/tmp`, `$HOME` writable (package managers keep logs and config there), the
/// workdir and each mount bound read-write, the env set, and the child killed with its parent.
///
/// Errors: [`Error::Invalid`] when `argv` is empty.
pub fn bwrap_command(binds: &Binds, argv: &[OsString]) -> Result<Command> {
    if argv.is_empty() {
        return Err(Error::invalid("sandbox: nothing to run"));
    }
    let mut cmd = Command::new("bwrap");
    cmd.args(["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]);
    cmd.args(["--tmpfs", "/tmp"]);
    if let Some(home) = std::env::var_os("HOME").filter(|h| Path::new(h).is_dir()) {
        cmd.arg("--bind").arg(&home).arg(&home);
    }
    cmd.args(args(Driver::Bwrap, binds));
    cmd.args(["--die-with-parent", "--"]);
    cmd.args(argv);
    Ok(cmd)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binds() -> Binds {
        Binds {
            workdir: "/w".into(),
            mounts: vec!["/w/node_modules".into(), "/cache/npm".into()],
            env: [("npm_config_cache".to_string(), "/cache/npm".to_string())].into(),
        }
    }

    #[test]
    fn bwrap_args_bind_parents_first() {
        let a = args(Driver::Bwrap, &binds());
        let j = a.join(" ");
        assert!(
            j.starts_with("--bind /w /w --bind /cache/npm /cache/npm --bind /w/node_modules"),
            "{j}"
        );
        assert!(j.contains("--setenv npm_config_cache /cache/npm"), "{j}");
    }

    #[test]
    fn docker_args() {
        let a = args(Driver::Docker, &binds());
        let j = a.join(" ");
        assert!(j.contains("-v /cache/npm:/cache/npm"), "{j}");
        assert!(j.contains("-e npm_config_cache=/cache/npm"), "{j}");
        assert!(j.ends_with("-w /w"), "{j}");
        assert!(
            Driver::parse("podman")
                .unwrap_err()
                .to_string()
                .contains("--driver")
        );
    }

    #[test]
    fn quoting() {
        let words: Vec<String> = vec!["a".into(), "b c".into(), "it's".into(), "$(x)".into()];
        let q = shell_quote(&words).unwrap();
        assert_eq!(q, "a 'b c' \"it's\" '$(x)'");
        assert_eq!(shlex::split(&q).unwrap(), words);
    }
}
