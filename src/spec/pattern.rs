//! Key-file and exclude patterns: the globs a spec names (checked when it is parsed) and the
//! walk that finds their matches (key files when a key is computed, excludes before a
//! promotion).

use std::fs;
use std::path::{Path, PathBuf};

use crate::error::{Error, IoContext, Result};

/// A key-file or exclude pattern: `*` and `?` within one name (they never match `/`), `**` any
/// number of directories, `[…]` and `{a,b}` as globset reads them (with `\\` escaping the next
/// character). A pattern without any of `*?[]{}\\` names one path and is compared as text;
/// only the others are compiled (globset, a regex each: ~0.1 ms, which a hit's key paid for
/// every literal key and config file).
#[derive(Debug)]
pub struct Pattern {
    text: String,
    /// The compiled glob; `None` for a literal pattern ([`Pattern::is_literal`]).
    matcher: Option<globset::GlobMatcher>,
    /// How many path components a match has, when the pattern has no `**`.
    depth: Option<usize>,
}

/// The characters that make a pattern a glob rather than one path (globset's syntax).
const GLOB_CHARS: [char; 7] = ['*', '?', '[', ']', '{', '}', '\\'];

impl Pattern {
    /// Compiles `pattern`, a relative `/`-separated glob (empty components are dropped:
    /// `a//b/` is `a/b`).
    ///
    /// Errors: globset's message naming the pattern (an unclosed `[`, say).
    pub fn new(pattern: &str) -> std::result::Result<Pattern, String> {
        let comps: Vec<&str> = pattern.split('/').filter(|c| !c.is_empty()).collect();
        let text = comps.join("/");
        let matcher = if text.contains(GLOB_CHARS) {
            let glob = globset::GlobBuilder::new(&text)
                .literal_separator(true)
                .build()
                .map_err(|e| e.to_string())?;
            Some(glob.compile_matcher())
        } else {
            None
        };
        let depth = (!comps.contains(&"**")).then_some(comps.len());
        Ok(Pattern {
            text,
            matcher,
            depth,
        })
    }

    /// Whether `rel` (relative, `/`-separated) matches.
    pub fn is_match(&self, rel: &Path) -> bool {
        match &self.matcher {
            Some(m) => m.is_match(rel),
            None => rel.to_str() == Some(self.text.as_str()),
        }
    }

    /// True when the pattern names one path (no glob syntax).
    pub fn is_literal(&self) -> bool {
        self.matcher.is_none()
    }

    /// Appends the matches under `root` to `out` (relative paths): regular files only when
    /// `files_only` (following a final symlink), any entry otherwise. Directories named in
    /// `skip` are not entered under `**`; nor are symlinked directories.
    pub(crate) fn walk(
        &self,
        root: &Path,
        skip: &[&str],
        files_only: bool,
        out: &mut Vec<PathBuf>,
    ) -> Result<()> {
        let wanted = |rel: &Path| {
            let p = root.join(rel);
            if files_only {
                fs::metadata(&p).is_ok_and(|m| m.is_file())
            } else {
                fs::symlink_metadata(&p).is_ok()
            }
        };
        if self.is_literal() {
            let rel = PathBuf::from(&self.text);
            if wanted(&rel) {
                out.push(rel);
            }
            return Ok(());
        }
        let mut stack = vec![PathBuf::new()];
        while let Some(rel) = stack.pop() {
            let level = rel.components().count();
            for name in list_dir(&root.join(&rel))? {
                let sub = rel.join(&name);
                if self.is_match(&sub) && wanted(&sub) {
                    out.push(sub.clone());
                }
                let enter = match self.depth {
                    Some(d) => {
                        level + 1 < d && fs::metadata(root.join(&sub)).is_ok_and(|m| m.is_dir())
                    }
                    None => {
                        !skip.contains(&name.as_str())
                            && fs::symlink_metadata(root.join(&sub)).is_ok_and(|m| m.is_dir())
                    }
                };
                if enter {
                    stack.push(sub);
                }
            }
        }
        Ok(())
    }
}

fn list_dir(dir: &Path) -> Result<Vec<String>> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => {
            return Ok(Vec::new());
        }
        Err(e) => return Err(Error::io(dir, e)),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.at(dir)?;
        if let Some(name) = entry.file_name().to_str() {
            names.push(name.to_string());
        }
    }
    names.sort();
    Ok(names)
}
