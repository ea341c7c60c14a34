//! The `-r`/`-c` includes of requirements files that join a cache's key files, and the rule
//! that a key file (or a directory a key-file glob walks) must resolve inside the workdir.

use std::fs;
use std::path::{Path, PathBuf};

use crate::error::{Error, IoContext, Result};

/// How deep `-r`/`-c` includes of requirements files may nest below a key file.
pub(super) const MAX_INCLUDE_DEPTH: usize = 8;
/// How many files includes may add to one cache's key files.
pub(super) const MAX_INCLUDED_FILES: usize = 64;

/// Adds to `found` (key files relative to `workdir`) every file the requirements files among
/// them include with `-r`/`--requirement` or `-c`/`--constraint`, recursively, each read
/// relative to the file that names it (as pip does). A requirements file is a key file ending
/// in `.txt` or `.in`; included files are requirements files whatever their name. A URL include
/// is not followed (a warning on stderr says so: the key cannot cover it). A `${NAME}` in an
/// include's path (NAME of `A-Z`, `0-9`, `_`) is expanded from `env` (the run's environment),
/// as pip expands it in requirements files; an include naming an unset variable is skipped
/// with a warning naming it (pip would read it literally and fail, or the setup sets it).
///
/// Errors: [`Error::Invalid`] naming the cache, the including file, its line and the include
/// when the included file is missing, resolves (symlinks followed) outside the workdir's real
/// path `real_root` (the outside file is never read: same rule as the key files' own), or the
/// includes nest deeper than 8 or add more than 64 files; [`Error::Io`] when a requirements
/// file cannot be read.
pub(super) fn follow_includes(
    id: &str,
    workdir: &Path,
    real_root: &Path,
    env: &dyn Fn(&str) -> Option<String>,
    found: &mut Vec<PathBuf>,
) -> Result<()> {
    let is_requirements = |p: &Path| p.extension().is_some_and(|e| e == "txt" || e == "in");
    let mut todo: Vec<(PathBuf, usize)> = found
        .iter()
        .filter(|p| is_requirements(p))
        .map(|p| (p.clone(), 0))
        .collect();
    let mut added = 0;
    while let Some((rel, depth)) = todo.pop() {
        let abs = workdir.join(&rel);
        let text = String::from_utf8_lossy(&fs::read(&abs).at(&abs)?).into_owned();
        for (line, opt, target) in requirement_includes(&text) {
            let at = format!(
                "cache {id:?}: key file {} line {line}: {opt} {target}",
                rel.display()
            );
            if target.contains("://") {
                eprintln!(
                    "layercache: warning: {at}: a URL is not followed into the key; a change \
                     behind it does not change the key"
                );
                continue;
            }
            let target = match expand_env_vars(&target, env) {
                Ok(t) => t,
                Err(unset) => {
                    eprintln!(
                        "layercache: warning: {at}: ${{{unset}}} is not set, so this include is \
                         not followed into the key; set {unset} for the run to key on it"
                    );
                    continue;
                }
            };
            let inc_abs = abs.parent().unwrap_or(workdir).join(&target);
            let real = fs::canonicalize(&inc_abs).map_err(|e| {
                Error::invalid(format!(
                    "{at}: cannot read {}: {e}; an include is read relative to the file that \
                     names it and must be a file of the project",
                    inc_abs.display()
                ))
            })?;
            let Ok(inside) = real.strip_prefix(real_root) else {
                return Err(Error::invalid(format!(
                    "{at}: {} leads outside the project ({}); included requirements files must \
                     resolve to paths under the workdir",
                    real.display(),
                    real_root.display()
                )));
            };
            if !real.is_file() {
                return Err(Error::invalid(format!(
                    "{at}: {} is not a file; an include names a requirements file",
                    real.display()
                )));
            }
            let inside = inside.to_path_buf();
            if found.contains(&inside) {
                continue;
            }
            if depth + 1 > MAX_INCLUDE_DEPTH || added == MAX_INCLUDED_FILES {
                return Err(Error::invalid(format!(
                    "{at}: includes nest deeper than {MAX_INCLUDE_DEPTH} or add more than \
                     {MAX_INCLUDED_FILES} files; name the requirements files in key_files instead"
                )));
            }
            added += 1;
            found.push(inside.clone());
            todo.push((inside, depth + 1));
        }
    }
    Ok(())
}

/// `s` with each `${NAME}` (NAME of ASCII capitals, digits and `_`, the form pip expands in
/// requirements files: pip's docs, "Using Environment Variables") replaced by `env(NAME)`;
/// anything else (`$NAME`, `${lower}`) stays literal, as in pip.
///
/// Errors: the first NAME that `env` does not know.
pub(super) fn expand_env_vars(
    s: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> std::result::Result<String, String> {
    let mut out = String::new();
    let mut rest = s;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let name_len = after
            .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(after.len());
        if name_len == 0 || !after[name_len..].starts_with('}') {
            out.push_str("${");
            rest = after;
            continue;
        }
        let name = &after[..name_len];
        out.push_str(&env(name).ok_or_else(|| name.to_string())?);
        rest = &after[name_len + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The include options of a pip requirements file, as `(line number, option, file)` (the
/// line 1-based, the option as written: `-r`, `--constraint`, …): `-r`/`--requirement` and `-c`/`--constraint`, each
/// with its file after a space, `=` or (short forms) directly. Comments (`#` at the start or
/// after whitespace) and `\` line continuations are handled as pip's requirements-file format
/// does (pip's docs, "Requirements File Format").
pub(super) fn requirement_includes(text: &str) -> Vec<(usize, &'static str, String)> {
    let mut out = Vec::new();
    let mut joined = String::new();
    let mut first_line = 0;
    for (n, raw) in text.lines().enumerate() {
        if joined.is_empty() {
            first_line = n + 1;
        }
        if let Some(cont) = raw.strip_suffix('\\') {
            joined.push_str(cont);
            continue;
        }
        joined.push_str(raw);
        let line = std::mem::take(&mut joined);
        let line = match line.find('#') {
            Some(0) => "",
            Some(at) if line[..at].ends_with(char::is_whitespace) => &line[..at],
            _ => line.as_str(),
        }
        .trim();
        let file = ["--requirement", "--constraint", "-r", "-c"]
            .iter()
            .find_map(|opt| {
                let rest = line.strip_prefix(opt)?;
                let long = opt.starts_with("--");
                let rest = if let Some(r) = rest.strip_prefix('=') {
                    r
                } else if rest.starts_with(char::is_whitespace) || !long {
                    rest
                } else {
                    return None;
                };
                let rest = rest.trim().trim_matches(['"', '\'']);
                (!rest.is_empty()).then(|| (*opt, rest.to_string()))
            });
        if let Some((opt, f)) = file {
            out.push((first_line, opt, f));
        }
    }
    out
}

/// Refuses `rel` (a key file, or the directory a key-file glob walks) of the key_files entry
/// `pattern` when its real path (symlinks resolved) is not under `real_root`, the workdir's
/// real path: a symlink must not carry a hash of an outside file (`/etc/shadow`) into the key's
/// inputs, the store and the remote tier.
pub(super) fn check_inside(
    id: &str,
    pattern: &str,
    workdir: &Path,
    real_root: &Path,
    rel: &Path,
) -> Result<()> {
    let abs = workdir.join(rel);
    let real = fs::canonicalize(&abs).at(&abs)?;
    if real.starts_with(real_root) {
        return Ok(());
    }
    Err(Error::invalid(format!(
        "cache {id:?}: key_files {pattern:?}: {} -> {} leads outside the project ({}); key files \
         must resolve to paths under the workdir",
        rel.display(),
        real.display(),
        real_root.display()
    )))
}
