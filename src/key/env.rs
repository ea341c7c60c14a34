//! The environment fingerprint's inputs (sandbox image, tool versions) and the project's key
//! salt: what `env8` of a key is made from (see the module docs of `key`).

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

use crate::error::{Error, Result};

/// The environment fingerprint's inputs, probed once per run (tool versions are cached).
#[derive(Debug)]
pub struct Environment {
    /// `std::env::consts::OS`, e.g. `linux`.
    pub os: String,
    /// `std::env::consts::ARCH`, e.g. `x86_64`.
    pub arch: String,
    /// The sandbox image id, if any.
    pub image: Option<String>,
    /// The tools run inside `image` (`--sandbox docker`): their host versions mean nothing, the
    /// image id stands for them.
    tools_in_image: bool,
    versions: Mutex<BTreeMap<String, String>>,
    /// The variables `{env:NAME}` reads, when not the process's own (tests).
    variables: Option<BTreeMap<String, String>>,
    /// The project's key salt ([`KeySalt`]); `None` (tests of what a key covers) digests
    /// with plain blake3.
    salt: Option<KeySalt>,
}

/// A project's key salt: 32 random bytes (the store keeps them with the project, mode 0600,
/// and in the remote tier so runners agree), the key of every digest a key is made of and
/// every digest its recorded inputs hold — blake3's keyed mode (`blake3::keyed_hash`), so a
/// digest of a weak secret (`{env:TOKEN}`, an `.npmrc`) cannot be tried offline by whoever
/// reads the inputs or the key without the salt, and two projects' digests of one value differ.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct KeySalt(pub [u8; 32]);

impl KeySalt {
    /// The salt provisioned in the environment variable `LAYERCACHE_KEY_SALT` (64 hex digits,
    /// e.g. `openssl rand -hex 32`), if set: runners given the same one agree on keys without
    /// the salt ever being stored in the remote tier. `None` when unset or empty.
    ///
    /// Errors: [`Error::Invalid`] naming the variable when it is not 64 hex digits.
    pub fn from_env() -> Result<Option<KeySalt>> {
        let Some(v) = std::env::var_os("LAYERCACHE_KEY_SALT").filter(|v| !v.is_empty()) else {
            return Ok(None);
        };
        crate::store::salt_from_hex(v.as_encoded_bytes())
            .map(|s| Some(KeySalt(s)))
            .ok_or_else(|| {
                Error::invalid(
                    "LAYERCACHE_KEY_SALT: not a key salt; want 64 hex digits \
                     (e.g. from `openssl rand -hex 32`)",
                )
            })
    }
}

impl std::fmt::Debug for KeySalt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeySalt(..)")
    }
}

impl Environment {
    /// The host environment with an optional image id; tool versions are probed lazily by
    /// running the tool.
    pub fn host(image: Option<String>) -> Self {
        Environment {
            os: std::env::consts::OS.to_string(),
            arch: std::env::consts::ARCH.to_string(),
            image: image.filter(|i| !i.is_empty()),
            tools_in_image: false,
            versions: Mutex::new(BTreeMap::new()),
            variables: None,
            salt: None,
        }
    }

    /// The environment of steps that run in a container of image `image_id` (`sha256:…`):
    /// every tool's version is `in image`, and the image id fingerprints them all.
    pub fn in_image(image_id: String) -> Self {
        Environment {
            tools_in_image: true,
            ..Self::host(Some(image_id))
        }
    }

    /// An environment with fixed tool versions (tests; tools not listed are probed).
    #[cfg(test)]
    pub fn with_versions(image: Option<String>, versions: &[(&str, &str)]) -> Self {
        let env = Self::host(image);
        if let Ok(mut v) = env.versions.lock() {
            for (tool, version) in versions {
                v.insert(tool.to_string(), version.to_string());
            }
        }
        env
    }

    /// This environment with `{env:NAME}` variables read from `vars` instead of the process's
    /// environment (tests; a name not listed is unset).
    #[cfg(test)]
    pub fn with_variables(mut self, vars: &[(&str, &str)]) -> Self {
        let map = vars.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        self.variables = Some(map.collect());
        self
    }

    /// This environment with the project's key salt: every digest of the key and of its
    /// recorded inputs is keyed with it ([`KeySalt`]).
    pub fn with_salt(mut self, salt: KeySalt) -> Self {
        self.salt = Some(salt);
        self
    }

    /// A hasher for one digest: blake3 keyed with the salt, or plain without one.
    pub(super) fn hasher(&self) -> blake3::Hasher {
        match &self.salt {
            Some(KeySalt(k)) => blake3::Hasher::new_keyed(k),
            None => blake3::Hasher::new(),
        }
    }

    /// The 16-hex digest of `bytes` recorded in a key's inputs (keyed with the salt).
    pub(super) fn digest(&self, bytes: &[u8]) -> String {
        let mut h = self.hasher();
        h.update(bytes);
        h.finalize().to_hex()[..16].to_string()
    }

    /// The value of variable `name` for `{env:NAME}` (`None`: unset).
    pub(super) fn variable(&self, name: &str) -> Option<String> {
        match &self.variables {
            Some(vars) => vars.get(name).cloned(),
            None => std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()),
        }
    }

    /// The first line `tool --version` prints (`go version` for Go), or `none` when the tool is
    /// missing or fails; `in image` for an [`Environment::in_image`].
    pub fn tool_version(&self, tool: &str) -> String {
        if self.tools_in_image {
            return "in image".into();
        }
        if let Some(v) = self.versions.lock().ok().and_then(|v| v.get(tool).cloned()) {
            return v;
        }
        let version = probe_version(tool);
        if let Ok(mut v) = self.versions.lock() {
            v.insert(tool.to_string(), version.clone());
        }
        version
    }

    /// The fingerprint string hashed into `env8` for these tools (stable: tools are sorted).
    pub fn fingerprint(&self, tools: &[&str]) -> String {
        let mut tools: Vec<&str> = tools.to_vec();
        tools.sort_unstable();
        tools.dedup();
        let mut s = format!(
            "os={}\narch={}\nimage={}\n",
            self.os,
            self.arch,
            self.image.as_deref().unwrap_or("none")
        );
        for t in tools {
            s.push_str(&format!("{t}={}\n", self.tool_version(t)));
        }
        s
    }
}

/// The `tool --version` processes [`start_probes`] started, each taken (and waited for) by the
/// first [`probe_version`] of its tool.
static STARTED: Mutex<BTreeMap<String, Child>> = Mutex::new(BTreeMap::new());

/// Starts `tool --version` (`go version` for Go) of each of `tools` now, in the background, so
/// that the key computation later finds its output ready: a hit's run starts them before it
/// opens the store and reaps old runs, and `node --version` (~7 ms) no longer adds to the time
/// to COMMAND. Child processes only, no thread: safe before a rootless run's `unshare`. A tool
/// already started is not started twice; one that cannot be spawned is probed again (and
/// reported `none`) when its version is asked.
pub fn start_probes<'a>(tools: impl IntoIterator<Item = &'a str>) {
    let Ok(mut started) = STARTED.lock() else {
        return;
    };
    for tool in tools {
        if !started.contains_key(tool)
            && let Ok(child) = version_command(tool).spawn()
        {
            started.insert(tool.to_string(), child);
        }
    }
}

/// `tool --version` (`go version`) with stdin closed and its output captured.
fn version_command(tool: &str) -> Command {
    let arg = if tool == "go" { "version" } else { "--version" };
    let mut cmd = Command::new(tool);
    cmd.arg(arg)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// The first non-blank line `tool --version` prints on stdout (stderr when stdout is blank:
/// older Java), or `none` when the tool is missing or exits non-zero; the output of the probe
/// [`start_probes`] started, when there is one.
pub(super) fn probe_version(tool: &str) -> String {
    let started = STARTED.lock().ok().and_then(|mut s| s.remove(tool));
    let out = match started {
        Some(child) => child.wait_with_output(),
        None => version_command(tool).output(),
    };
    match out {
        Ok(o) if o.status.success() => {
            let text = if o.stdout.iter().any(|b| !b.is_ascii_whitespace()) {
                o.stdout
            } else {
                o.stderr
            };
            String::from_utf8_lossy(&text)
                .lines()
                .map(str::trim)
                .find(|l| !l.is_empty())
                .unwrap_or("none")
                .to_string()
        }
        _ => "none".to_string(),
    }
}
