//! Spec validation for the API and the editor, and the stored spec of each project.
//!
//! Validation is [`crate::spec::parse`], the CLI's own: its message `field: text` becomes a
//! [`FieldError`] with the line of the spec the field is on.
//!
//! Stored specs live in the project's own directory of the store, versioned:
//! ```text
//! <store>/v1/projects/<project>/specs/<n>.toml|json   every saved version, never rewritten
//! <store>/v1/projects/<project>/specs/current         "<n>.toml\n", replaced atomically (rename)
//! ```
//! A version file is created with `O_EXCL` (two saves never share a number) and fsynced before
//! `current` points at it, so a reader sees the old spec or the new one, never a partial file.

use std::fs;
use std::io::Write;
use std::path::Path;

use serde::Serialize;

use super::errors::{AppError, FieldError};
use crate::error::{Error, IoContext};
use crate::ids::ProjectId;
use crate::spec::Spec;
use crate::store::ProjectDirs;

/// The largest spec accepted, bytes.
pub const MAX_SPEC_BYTES: usize = 256 * 1024;

/// Parses and validates `text` like `layercache run --spec` does.
///
/// Errors: [`AppError::Invalid`] with a [`FieldError`] per bad field (see
/// [`crate::spec::parse_all`]; `spec` for a syntax error, with its line).
pub fn validate(text: &str) -> Result<Spec, AppError> {
    if text.len() > MAX_SPEC_BYTES {
        return Err(AppError::Invalid(vec![FieldError {
            field: "spec".into(),
            message: format!(
                "spec is {} bytes; at most {MAX_SPEC_BYTES} are accepted",
                text.len()
            ),
            line: None,
        }]));
    }
    crate::spec::parse_all(text).map_err(|errors| {
        let errors = errors.into_iter().map(|m| field_error(text, &m)).collect();
        AppError::Invalid(errors)
    })
}

/// Splits a spec error message (one of [`crate::spec::parse_all`]'s) into the field it names
/// and its message, and finds the field's line in `text`.
pub fn field_error(text: &str, msg: &str) -> FieldError {
    let msg = msg.to_string();
    // The validator's messages read `project: …` or `cache[i].field: …`.
    if let Some((head, _)) = msg.split_once(": ")
        && is_field_path(head)
    {
        return FieldError {
            field: head.to_string(),
            line: field_line(text, head),
            message: msg,
        };
    }
    // A syntax error or an unknown field from serde/toml: `TOML parse error at line 3, …` or
    // `… at line 3 column 5`.
    FieldError {
        field: "spec".into(),
        line: syntax_line(&msg),
        message: msg,
    }
}

fn is_field_path(s: &str) -> bool {
    if s == "project" || s == "user" {
        return true;
    }
    let Some(rest) = s.strip_prefix("cache[") else {
        return false;
    };
    let Some((n, field)) = rest.split_once("].") else {
        return false;
    };
    n.bytes().all(|b| b.is_ascii_digit())
        && !field.is_empty()
        && field.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
}

/// The 1-based line a field path (`project`, `cache[1].preset`) is on in a TOML spec: the line
/// of the key inside the `i`-th `[[cache]]` table, else the table's header line.
fn field_line(text: &str, field: &str) -> Option<usize> {
    let key_at = |line: &str, key: &str| {
        let l = line.trim_start();
        l.strip_prefix(key)
            .is_some_and(|r| r.trim_start().starts_with('='))
    };
    let lines: Vec<&str> = text.lines().collect();
    if field == "project" || field == "user" {
        return lines.iter().position(|l| key_at(l, field)).map(|i| i + 1);
    }
    let rest = field.strip_prefix("cache[")?;
    let (n, key) = rest.split_once("].")?;
    let n: usize = n.parse().ok()?;
    let headers: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| {
            let t = l.trim();
            t.starts_with("[[cache]]") || t.starts_with("[[caches]]")
        })
        .map(|(i, _)| i)
        .collect();
    let start = *headers.get(n)?;
    let end = headers.get(n + 1).copied().unwrap_or(lines.len());
    let found = (start..end).find(|&i| key_at(lines[i], key));
    Some(found.unwrap_or(start) + 1)
}

fn syntax_line(msg: &str) -> Option<usize> {
    let at = msg.find("line ")?;
    let digits: String = msg[at + 5..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok()
}

/// A stored spec version.
#[derive(Clone, Debug, Serialize)]
pub struct Stored {
    /// The project.
    pub project: ProjectId,
    /// The version number (1, 2, …).
    pub version: u64,
    /// `toml` or `json`.
    pub format: &'static str,
    /// The spec text as it was saved.
    pub text: String,
}

fn version_of(name: &str) -> Option<(u64, &'static str)> {
    let (n, ext) = name.split_once('.')?;
    let format = match ext {
        "toml" => "toml",
        "json" => "json",
        _ => return None,
    };
    Some((n.parse().ok()?, format))
}

/// The saved versions of `pd`'s spec, ascending.
///
/// Errors: [`Error::Io`] reading `specs/`.
pub fn versions(pd: &ProjectDirs) -> crate::Result<Vec<u64>> {
    let dir = pd.specs_dir();
    let rd = match fs::read_dir(&dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(&dir, e)),
    };
    let mut out = Vec::new();
    for ent in rd {
        let ent = ent.at(&dir)?;
        if let Some((n, _)) = ent.file_name().to_str().and_then(version_of) {
            out.push(n);
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// The current stored spec of `pd`, if one was saved.
///
/// Errors: [`Error::Io`] reading it; [`Error::Failed`] when `current` names no version.
pub fn current(pd: &ProjectDirs) -> crate::Result<Option<Stored>> {
    let dir = pd.specs_dir();
    let ptr = dir.join("current");
    let name = match fs::read_to_string(&ptr) {
        Ok(s) => s.trim().to_string(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(&ptr, e)),
    };
    let (version, format) = version_of(&name)
        .ok_or_else(|| Error::Failed(format!("{}: names no spec version", ptr.display())))?;
    let path = dir.join(&name);
    let text = fs::read_to_string(&path).at(&path)?;
    Ok(Some(Stored {
        project: pd.project.clone(),
        version,
        format,
        text,
    }))
}

/// The current stored spec of `project` in the store at `root`, parsed, for
/// `layercache run --project P`.
///
/// Errors: [`Error::Invalid`] (exit 2) for a bad project id, no store, a project the store does
/// not have, a project without a stored spec, or a stored spec that no longer validates (naming
/// its version); [`Error::Io`] reading it.
pub fn load_stored(root: &Path, project: &str) -> crate::Result<Spec> {
    let p = ProjectId::new(project)?;
    let store = crate::store::Store::open_existing(root)?.ok_or_else(|| {
        Error::invalid(format!(
            "--project {p}: no layercache store at {}",
            root.display()
        ))
    })?;
    let Some(pd) = store.projects(Some(&p))?.pop() else {
        let known: Vec<String> = store
            .projects(None)?
            .iter()
            .map(|pd| pd.project.to_string())
            .collect();
        return Err(crate::store::no_such_project(root, &p, &known));
    };
    let Some(stored) = current(&pd)? else {
        return Err(Error::invalid(format!(
            "--project {p}: the project has no stored spec (save one on the spec page of \
             `layercache serve` or with PUT /api/v1/projects/{p}/spec), or pass --spec FILE"
        )));
    };
    let spec = crate::spec::parse(&stored.text).map_err(|e| {
        Error::invalid(format!(
            "stored spec of {p} (version {}): {e}",
            stored.version
        ))
    })?;
    if spec.project != p {
        return Err(Error::invalid(format!(
            "stored spec of {p} (version {}) declares project {}",
            stored.version, spec.project
        )));
    }
    Ok(spec)
}

/// Saves `text` (already validated, for `pd`'s project) as the next version and points
/// `current` at it; returns the new version.
///
/// Errors: [`Error::Io`] when `specs/` cannot be written.
pub fn save(pd: &ProjectDirs, text: &str) -> crate::Result<Stored> {
    let dir = pd.specs_dir();
    match fs::DirBuilder::new().create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(Error::io(&dir, e)),
    }
    let format = if text.trim_start().starts_with('{') {
        "json"
    } else {
        "toml"
    };
    let mut version = versions(pd)?.last().copied().unwrap_or(0) + 1;
    let name = loop {
        let name = format!("{version}.{format}");
        let path = dir.join(&name);
        match fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(mut f) => {
                f.write_all(text.as_bytes()).at(&path)?;
                f.sync_all().at(&path)?;
                break name;
            }
            // Another save took this number: take the next.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => version += 1,
            Err(e) => return Err(Error::io(&path, e)),
        }
    };
    replace_atomically(&dir.join("current"), format!("{name}\n").as_bytes())?;
    Ok(Stored {
        project: pd.project.clone(),
        version,
        format,
        text: text.to_string(),
    })
}

/// Writes `bytes` to a temporary file next to `path`, fsyncs it and renames it over `path`.
fn replace_atomically(path: &Path, bytes: &[u8]) -> crate::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(".current-{}", crate::sys::random_hex(6)));
    let result = (|| {
        let mut f = fs::File::create(&tmp).at(&tmp)?;
        f.write_all(bytes).at(&tmp)?;
        f.sync_all().at(&tmp)?;
        fs::rename(&tmp, path).at(path)?;
        fs::File::open(dir).and_then(|d| d.sync_all()).at(dir)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_errors_name_the_field_and_line() {
        let text = "project = \"p\"\n\n[[cache]]\nid = \"a\"\npreset = \"npm\"\n\n[[cache]]\nid = \"b\"\npreset = \"nope\"\n";
        let AppError::Invalid(errs) = validate(text).unwrap_err() else {
            panic!()
        };
        assert_eq!(errs[0].field, "cache[1].preset");
        assert_eq!(errs[0].line, Some(9));
        assert!(errs[0].message.contains("unknown preset"), "{errs:?}");
        // Two bad caches: both are reported, each on its own line, and every bad field of
        // each (cache[1] has neither setup nor key files; issue 24).
        let two =
            "project = \"p\"\n[[cache]]\nid = \"a\"\npreset = \"x\"\n\n[[cache]]\nid = \"b\"\n";
        let AppError::Invalid(errs) = validate(two).unwrap_err() else {
            panic!()
        };
        let fields: Vec<_> = errs.iter().map(|e| (e.field.as_str(), e.line)).collect();
        assert_eq!(
            fields,
            [
                ("cache[0].preset", Some(4)),
                ("cache[1].setup", Some(6)),
                ("cache[1].key_files", Some(6))
            ],
            "{errs:?}"
        );
        let AppError::Invalid(errs) = validate("project = \"a/b\"\n").unwrap_err() else {
            panic!()
        };
        assert_eq!((errs[0].field.as_str(), errs[0].line), ("project", Some(1)));
        let AppError::Invalid(errs) = validate("project = \n").unwrap_err() else {
            panic!()
        };
        assert_eq!((errs[0].field.as_str(), errs[0].line), ("spec", Some(1)));
        let AppError::Invalid(errs) = validate("project = \"p\"\nuser = \"a b\"\n").unwrap_err()
        else {
            panic!()
        };
        assert_eq!((errs[0].field.as_str(), errs[0].line), ("user", Some(2)));
    }

    #[test]
    fn save_versions_and_current() {
        let d = tempfile::tempdir().unwrap();
        let pd = ProjectDirs {
            project: ProjectId::new("p").unwrap(),
            root: d.path().to_path_buf(),
        };
        assert!(current(&pd).unwrap().is_none());
        assert_eq!(save(&pd, "project = \"p\"\n").unwrap().version, 1);
        let s = save(&pd, "{\"project\": \"p\"}").unwrap();
        assert_eq!((s.version, s.format), (2, "json"));
        let c = current(&pd).unwrap().unwrap();
        assert_eq!((c.version, c.text.as_str()), (2, "{\"project\": \"p\"}"));
        assert_eq!(versions(&pd).unwrap(), vec![1, 2]);
    }
}
