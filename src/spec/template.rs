//! The templates of a spec's `env` values, `mountpoint` and scripts: `{mount}`, `{workdir}`,
//! `{mount_root}` and `{env:NAME}` (see the module docs of `spec`), expanded for a run and
//! checked when the spec is read.

use std::path::Path;

use super::Paths;

/// Expands `{mount}`, `{workdir}`, `{mount_root}` and `{env:NAME}` in `template` (for `env`
/// values and `mountpoint`: no shell is involved). `{workdir}` is the workdir as the tools see
/// it; `{{` and `}}` stand for a literal brace. Anything else in braces is left as it is
/// ([`check_templates`] refuses unknown names when the spec is read).
pub fn expand(template: &str, paths: &Paths, mount: Option<&Path>) -> String {
    substitute(template, paths, mount, |v| v.to_string())
}

/// [`expand`] for a setup or maintenance script: every value is shell-quoted (shlex), so a
/// path with spaces or `$(…)` in it stays one word and never runs.
pub fn expand_script(template: &str, paths: &Paths, mount: Option<&Path>) -> String {
    substitute(template, paths, mount, |v| {
        shlex::try_quote(v)
            .map(|q| q.into_owned())
            .unwrap_or_else(|_| "''".to_string())
    })
}

/// A template name at `{…}` per [`template_names`]: `Some(name)` for `{name}` made of letters,
/// digits, `_` and one optional `:` part (`env:NAME`), not preceded by `$` (so the shell's
/// `${VAR}` is left alone).
pub(super) fn template_at(text: &str, start: usize) -> Option<&str> {
    if start > 0 && text.as_bytes()[start - 1] == b'$' {
        return None;
    }
    let after = &text[start + 1..];
    let end = after.find('}')?;
    let name = &after[..end];
    let ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':')
        && name.bytes().filter(|b| *b == b':').count() <= 1;
    ok.then_some(name)
}

pub(super) fn substitute(
    template: &str,
    paths: &Paths,
    mount: Option<&Path>,
    quote: impl Fn(&str) -> String,
) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < template.len() {
        let rest = &template[i..];
        if rest.starts_with("{{") || rest.starts_with("}}") {
            out.push_str(&rest[..1]);
            i += 2;
            continue;
        }
        if rest.starts_with('{')
            && let Some(name) = template_at(template, i)
        {
            let value = match name {
                "mount" => mount.map(|m| m.display().to_string()),
                "workdir" => Some(paths.view_workdir().display().to_string()),
                "mount_root" => Some(paths.mount_root.display().to_string()),
                _ => name
                    .strip_prefix("env:")
                    .map(|var| std::env::var(var).unwrap_or_default()),
            };
            if let Some(v) = value {
                out.push_str(&quote(&v));
                i += name.len() + 2;
                continue;
            }
        }
        let ch = rest.chars().next().unwrap_or_default();
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

/// The byte offsets of the `{` that may open a template in `text`: every `{` but the two of
/// a `{{` (a literal brace).
pub(super) fn template_braces(text: &str) -> impl Iterator<Item = usize> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        loop {
            let at = i + text[i..].find('{')?;
            if text[at..].starts_with("{{") {
                i = at + 2;
                continue;
            }
            i = at + 1;
            return Some(at);
        }
    })
}

/// The first known template name `text` opens without closing it: `{mount_root` followed by
/// the end or by anything but `}` (a shell's `{ cmd; }`, `${VAR}` or awk's `{print}` are no
/// template names, so they pass).
pub(super) fn unclosed_template(text: &str) -> Option<&str> {
    template_braces(text)
        .filter(|&at| at == 0 || text.as_bytes()[at - 1] != b'$')
        .find_map(|at| {
            let after = &text[at + 1..];
            let len = after
                .bytes()
                .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b':')
                .count();
            let name = &after[..len];
            let known =
                matches!(name, "mount" | "workdir" | "mount_root") || name.starts_with("env:");
            (known && !after[len..].starts_with('}')).then_some(name)
        })
}

/// The template names `text` uses (see [`template_at`]).
pub(super) fn template_names(text: &str) -> Vec<&str> {
    template_braces(text)
        .filter_map(|at| template_at(text, at))
        .collect()
}

/// Checks every `{…}` template of `text` names a known one: `{mount}`, `{workdir}`,
/// `{mount_root}` or `{env:NAME}`.
///
/// Errors: a message naming the unknown template and the known ones.
pub(super) fn check_templates(text: &str) -> std::result::Result<(), String> {
    if let Some(name) = unclosed_template(text) {
        return Err(format!(
            "unclosed template {{{name} (write {{{name}}}, or {{{{ for a literal brace)"
        ));
    }
    for name in template_names(text) {
        let env_ok = name.strip_prefix("env:").is_some_and(|v| {
            !v.is_empty()
                && !v.as_bytes()[0].is_ascii_digit()
                && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        });
        if !(matches!(name, "mount" | "workdir" | "mount_root") || env_ok) {
            return Err(format!(
                "unknown template {{{name}}} (known: {{mount}}, {{workdir}}, {{mount_root}}, \
                 {{env:NAME}}; write {{{{ for a literal brace)"
            ));
        }
    }
    Ok(())
}
