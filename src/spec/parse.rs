//! Reading and validating a spec (TOML or JSON) into [`Spec`]: every problem is collected, so
//! one error names them all.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use serde::Deserialize;

use super::template::check_templates;
use super::*;
use crate::error::{Error, IoContext, Result};
use crate::ids::{CacheId, CacheKey, ProjectId};

/// The spec's `user` as written: a string, or an integer taken as a UID (`user = 1000` means
/// what `user = "1000"` and `--user 1000` mean).
#[derive(Debug)]
enum RawUser {
    Text(String),
    Uid(i128),
}

impl<'de> Deserialize<'de> for RawUser {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = RawUser;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a quoted \"UID:GID\", \"UID\", \"NAME\" or \"NAME:GROUP\", or a UID")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> std::result::Result<RawUser, E> {
                Ok(RawUser::Text(s.to_string()))
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> std::result::Result<RawUser, E> {
                Ok(RawUser::Uid(n.into()))
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> std::result::Result<RawUser, E> {
                Ok(RawUser::Uid(n.into()))
            }
        }
        d.deserialize_any(V)
    }
}

/// One `[[cache]]` as written (raw serde input; unknown fields are rejected by name). The
/// spec's top level (`project`, `user`, `cache` or its alias `caches`) is read field by field in
/// [`parse_all`], so a bad field of one part never hides another's.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCache {
    id: String,
    preset: Option<String>,
    setup: Option<String>,
    restore_setup: Option<String>,
    maintenance: Option<String>,
    key_files: Option<Vec<String>>,
    restore_keys: Option<Vec<String>>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    mountpoint: Option<String>,
    #[serde(default)]
    exclude: Vec<String>,
    relocatable: Option<bool>,
    passthrough: Option<String>,
    save: Option<String>,
}

/// The fields of [`RawCache`], as a spec names them (a unit test checks they are serde's).
pub(super) const CACHE_FIELDS: &[&str] = &[
    "id",
    "preset",
    "setup",
    "restore_setup",
    "maintenance",
    "key_files",
    "restore_keys",
    "env",
    "mountpoint",
    "exclude",
    "relocatable",
    "passthrough",
    "save",
];

/// The known field `name` most likely meant (Jaro-Winkler similarity ≥ 0.8, as clap's
/// suggestions use strsim), if any.
fn did_you_mean(name: &str, known: &[&'static str]) -> Option<&'static str> {
    (known.iter())
        .map(|k| (strsim::jaro_winkler(name, k), *k))
        .filter(|(score, _)| *score >= 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, k)| k)
}

/// The 1-based line of `text` where field `field` of `cache[i]` (`None`: the top level) is
/// set: a line `field = …` (TOML) or `"field": …` (JSON) after the i-th `[[cache]]` header
/// (before the first for the top level). `None` when no such line is found (an inline table,
/// a JSON spec's caches).
fn field_line(text: &str, cache: Option<usize>, field: &str) -> Option<usize> {
    let mut section: Option<usize> = None;
    for (n, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if t.starts_with("[[cache]]") || t.starts_with("[[caches]]") {
            section = Some(section.map_or(0, |s| s + 1));
            continue;
        }
        if section != cache {
            continue;
        }
        let rest = (t.strip_prefix(field))
            .or_else(|| t.strip_prefix(&format!("\"{field}\"")))
            .map(str::trim_start);
        if rest.is_some_and(|r| r.starts_with('=') || r.starts_with(':')) {
            return Some(n + 1);
        }
    }
    None
}

/// `errors` with the line of each unknown field added (`… unknown field `x` at line 4 …`).
fn with_lines(text: &str, errors: Vec<String>) -> Vec<String> {
    errors
        .into_iter()
        .map(|e| {
            let Some((head, msg)) = e.split_once(": ") else {
                return e;
            };
            if !msg.starts_with("unknown field") {
                return e;
            }
            let (cache, field) = match head.strip_prefix("cache[").and_then(|r| r.split_once("]."))
            {
                Some((i, f)) => (i.parse().ok(), f),
                None => (None, head),
            };
            let Some(line) = field_line(text, cache, field) else {
                return e;
            };
            // After "unknown field" and its quoted name, if serde gave one.
            let quoted = format!("unknown field `{field}`");
            let at = if msg.starts_with(&quoted) {
                quoted.len()
            } else {
                "unknown field".len()
            };
            format!("{head}: {} at line {line}{}", &msg[..at], &msg[at..])
        })
        .collect()
}

/// Reads a spec from `FILE`, or standard input when `source` is `-`.
///
/// Errors: [`Error::Invalid`] naming the file when it cannot be read or parsed (see [`parse`]);
/// [`Error::Io`] when standard input cannot be read.
pub fn load(source: &str) -> Result<Spec> {
    let (text, name) = if source == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .at("<standard input>")?;
        (s, "<standard input>".to_string())
    } else {
        let text = std::fs::read_to_string(source).map_err(|e| {
            // A spec that cannot be read is bad input (exit 2), like a spec that does not parse.
            Error::invalid(format!(
                "spec {source}: {e} (want a readable TOML or JSON file, or - for standard input)"
            ))
        })?;
        (text, source.to_string())
    };
    parse_all(&text).map_err(|errors| match errors.as_slice() {
        [one] => Error::invalid(format!("spec {name}: {one}")),
        many => Error::invalid(format!(
            "spec {name}: {} errors:\n  {}",
            many.len(),
            many.join("\n  ")
        )),
    })
}

/// Parses and validates a spec: JSON when the text starts with `{`, TOML otherwise.
///
/// Errors: [`Error::Invalid`] whose message is [`parse_all`]'s messages, one per line.
pub fn parse(text: &str) -> Result<Spec> {
    parse_all(text).map_err(|errors| Error::invalid(errors.join("\n")))
}

/// Parses and validates a spec like [`parse`], reporting every bad field: on error one message
/// per problem, in spec order, each one line naming its field (`project: …`,
/// `cache[i].<field>: …`; every bad field of each cache, a field of the wrong type or an
/// unknown one included: a type error in one cache hides nothing of another), or a single
/// message for a syntax error (`TOML syntax error at line L, column C: …`; JSON's
/// `… at line L column C`).
///
/// The fields checked: `project`, `user`, `cache[i].id` (invalid or duplicate), `cache[i].preset`
/// (unknown), `cache[i].setup` (missing without a preset), `cache[i].restore_setup` (empty),
/// `cache[i].key_files` (empty), `cache[i].restore_keys`, `cache[i].env`,
/// `cache[i].mountpoint` (a system directory, or `{workdir}` itself, is refused here),
/// `cache[i].exclude`, and the templates of `setup`, `restore_setup`, `maintenance`, `env` and
/// `mountpoint`.
pub fn parse_all(text: &str) -> std::result::Result<Spec, Vec<String>> {
    let mut doc = document(text).map_err(|e| vec![e])?;
    let mut errors: Vec<String> = Vec::new();
    let known = ["project", "user", "cache", "caches"];
    let mut meant = Vec::new();
    for k in doc.keys().filter(|k| !known.contains(&k.as_str())) {
        let hint = did_you_mean(k, &known).map(|m| {
            meant.push(m);
            format!("did you mean `{m}`? ")
        });
        errors.push(format!(
            "{k}: unknown field ({}a spec has project, user and [[cache]] tables)",
            hint.unwrap_or_default()
        ));
    }
    let project = match doc.remove("project") {
        // A misspelt `project` was said already.
        None if meant.contains(&"project") => None,
        None => {
            errors.push("project: missing: name the project, e.g. project = \"acme-web\"".into());
            None
        }
        Some(v) => String::deserialize(v)
            .map_err(|e| e.to_string())
            .and_then(|p| ProjectId::new(p).map_err(|e| e.to_string()))
            .map_err(|e| errors.push(format!("project: {e}")))
            .ok(),
    };
    let raw_user = match doc.remove("user").map(RawUser::deserialize).transpose() {
        Ok(u) => u,
        Err(e) => {
            errors.push(format!("user: {e}"));
            None
        }
    };
    let user = match raw_user {
        Some(RawUser::Text(s)) => Some(s),
        Some(RawUser::Uid(n)) if n < 0 => {
            let max = crate::sandbox::user::MAX_ID;
            errors.push(format!(
                "user: {n} is not a uid: use 0 to {max}, or a quoted \"UID:GID\", \"NAME\" or \
                 \"NAME:GROUP\""
            ));
            None
        }
        Some(RawUser::Uid(n)) => Some(n.to_string()),
        None => None,
    };
    if let Some(p) = user
        .as_deref()
        .and_then(crate::sandbox::user::syntax_problem)
    {
        errors.push(format!("user: {p}"));
    }
    let list = match (doc.remove("cache"), doc.remove("caches")) {
        (Some(_), Some(_)) => {
            errors.push("caches: give either cache or caches (its alias), not both".into());
            Vec::new()
        }
        (Some(v), None) | (None, Some(v)) => Vec::<serde_json::Value>::deserialize(v)
            .map_err(|e| errors.push(format!("cache: {e} (want [[cache]] tables)")))
            .unwrap_or_default(),
        (None, None) => Vec::new(),
    };
    let mut caches: Vec<(usize, Cache)> = Vec::new();
    // Every earlier id as written, valid caches or not, so a duplicate is named either way.
    let mut ids: Vec<(usize, String)> = Vec::new();
    for (i, value) in list.into_iter().enumerate() {
        let (rc, mut typed, bad_fields) = raw_cache(i, value);
        let Some(rc) = rc else {
            errors.append(&mut typed);
            continue;
        };
        let id = rc.id.clone();
        match validate_cache(i, rc, &ids) {
            Ok(c) if typed.is_empty() => caches.push((i, c)),
            Ok(_) => errors.append(&mut typed),
            Err(e) => {
                // A field of the wrong type was left out: its own checks (`setup: missing`)
                // would only repeat its type error.
                errors.append(&mut typed);
                let field = |m: &str| {
                    m.split_once(": ")
                        .and_then(|(h, _)| h.split_once("].").map(|(_, f)| f.to_string()))
                };
                errors.extend(
                    e.into_iter()
                        .filter(|m| field(m).is_none_or(|f| !bad_fields.contains(&f))),
                );
            }
        }
        ids.push((i, id));
    }
    errors.extend(shared_mountpoints(&caches));
    match project {
        Some(project) if errors.is_empty() => Ok(Spec {
            project,
            caches: caches.into_iter().map(|(_, c)| c).collect(),
            user,
        }),
        _ => Err(with_lines(text, errors)),
    }
}

/// The spec's top-level table: JSON when `text` starts with `{`, TOML otherwise (TOML tables
/// become JSON objects, so one reader checks both).
///
/// Errors: one line for a syntax error: `TOML syntax error at line L, column C: …` (1-based,
/// columns in characters), or serde_json's `… at line L column C`.
fn document(text: &str) -> std::result::Result<serde_json::Map<String, serde_json::Value>, String> {
    let value = if text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|e| format!("JSON syntax error: {e}"))?
    } else {
        let table: toml::Table = toml::from_str(text).map_err(|e| {
            let at = e.span().map(|s| {
                let before = &text[..s.start.min(text.len())];
                let line = before.matches('\n').count() + 1;
                let col = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
                format!(" at line {line}, column {col}")
            });
            let msg = e
                .message()
                .lines()
                .next()
                .unwrap_or("")
                .trim_end()
                .to_string();
            format!("TOML syntax error{}: {msg}", at.unwrap_or_default())
        })?;
        serde_json::to_value(table).map_err(|e| format!("spec: {e}"))?
    };
    match value {
        serde_json::Value::Object(m) => Ok(m),
        other => Err(format!(
            "spec: a spec is a table (TOML) or an object (JSON), not {other}"
        )),
    }
}

/// `cache[i]` as written, read field by field when it does not read whole: the cache (`None`
/// when even its `id` cannot be read), a message `cache[i].<field>: …` per field of the wrong
/// type or unknown, and those fields' names (left out of the cache returned).
fn raw_cache(i: usize, value: serde_json::Value) -> (Option<RawCache>, Vec<String>, Vec<String>) {
    let mut obj = match value {
        serde_json::Value::Object(m) => m,
        other => {
            return (
                None,
                vec![format!("cache[{i}]: want a table of fields, not {other}")],
                Vec::new(),
            );
        }
    };
    if let Ok(rc) = RawCache::deserialize(serde_json::Value::Object(obj.clone())) {
        return (Some(rc), Vec::new(), Vec::new());
    }
    let (mut errors, mut bad) = (Vec::new(), Vec::new());
    for (k, v) in &obj {
        // The field alone (beside a placeholder id): its own type error, or serde's
        // `unknown field`, naming the known ones.
        let mut probe = serde_json::Map::new();
        probe.insert("id".into(), serde_json::Value::String("x".into()));
        probe.insert(k.clone(), v.clone());
        if let Err(e) = RawCache::deserialize(serde_json::Value::Object(probe)) {
            match did_you_mean(k, CACHE_FIELDS).filter(|_| !CACHE_FIELDS.contains(&k.as_str())) {
                // A misspelt field: said with what it likely is, and that field's own
                // "missing" checks (a preset's: setup's and key_files') are not repeated.
                Some(meant) => {
                    errors.push(format!(
                        "cache[{i}].{k}: unknown field `{k}`, did you mean `{meant}`? (a cache's \
                         fields: {})",
                        CACHE_FIELDS.join(", ")
                    ));
                    bad.push(meant.to_string());
                    if meant == "preset" {
                        bad.extend(["setup".to_string(), "key_files".to_string()]);
                    }
                }
                None => errors.push(format!("cache[{i}].{k}: {e}")),
            }
            bad.push(k.clone());
        }
    }
    for k in &bad {
        obj.remove(k);
    }
    if !obj.contains_key("id") && !bad.iter().any(|k| k == "id") {
        errors.push(format!(
            "cache[{i}].id: missing: every cache needs an id, e.g. id = \"npm\""
        ));
    }
    match RawCache::deserialize(serde_json::Value::Object(obj)) {
        Ok(rc) => (Some(rc), errors, bad),
        Err(e) if errors.is_empty() => (None, vec![format!("cache[{i}]: {e}")], bad),
        Err(_) => (None, errors, bad),
    }
}

/// Two caches whose mountpoints are the same template (a cache's default is
/// `{mount_root}/<id>`) would mount at one view path: one message per later cache. Mountpoints
/// that differ as written but meet once the run's paths are known are refused by the run.
fn shared_mountpoints(caches: &[(usize, Cache)]) -> Vec<String> {
    let template = |c: &Cache| {
        let t =
            (c.mountpoint.clone()).unwrap_or_else(|| format!("{{mount_root}}/{}", c.id.as_str()));
        t.trim_end_matches('/').to_string()
    };
    let mut errors = Vec::new();
    for (k, (i, c)) in caches.iter().enumerate() {
        if let Some((j, first)) = caches[..k].iter().find(|(_, b)| template(b) == template(c)) {
            errors.push(format!(
                "cache[{i}].mountpoint: {:?} is also cache[{j}]'s (cache {:?}): give each cache \
                 its own",
                template(c),
                first.id.as_str()
            ));
        }
    }
    errors
}

/// Validates `cache[i]`; `before` are the ids of the caches declared before it, as written,
/// with their indices (for duplicate ids).
///
/// Errors: one message `cache[i].<field>: …` per bad field (every one, in field order; a field
/// that cannot be checked because an earlier one is bad, such as `setup` of an unknown preset,
/// is left out).
fn validate_cache(
    i: usize,
    rc: RawCache,
    before: &[(usize, String)],
) -> std::result::Result<Cache, Vec<String>> {
    let mut bad = Problems {
        i,
        errors: Vec::new(),
    };
    let id = cache_id(rc.id, before, &mut bad);
    let (preset, unknown_preset) = cache_preset(rc.preset.as_deref(), &mut bad);
    let (setup, restore_setup, maintenance) = scripts(
        (rc.setup, rc.restore_setup, rc.maintenance),
        preset,
        unknown_preset,
        &mut bad,
    );
    let key_files_explicit = rc.key_files.is_some();
    let key_files = key_inputs(
        rc.key_files,
        &rc.restore_keys,
        preset,
        unknown_preset,
        &mut bad,
    );
    let env = cache_env(rc.env, preset, &mut bad);
    let (mountpoint, exclude) = tree_paths(rc.mountpoint, rc.exclude, preset, &mut bad);
    // Templates last: their messages follow every field's own.
    let mut templates = vec![("setup", setup.as_str())];
    templates.extend(restore_setup.as_deref().map(|r| ("restore_setup", r)));
    templates.extend(maintenance.as_deref().map(|m| ("maintenance", m)));
    for (f, t) in templates {
        if let Err(m) = check_templates(t) {
            bad.add(f, m);
        }
    }
    for (k, v) in &env {
        if let Err(m) = check_templates(v) {
            bad.add("env", format!("{k}: {m}"));
        }
    }
    if let Some(mp) = &mountpoint
        && let Err(m) = check_templates(mp)
    {
        bad.add("mountpoint", m);
    }
    let relocatable = rc
        .relocatable
        .unwrap_or_else(|| preset.is_some_and(|p| p.relocatable));
    let passthrough = match rc.passthrough.as_deref() {
        None => crate::overlay::options::PassthroughChoice::Auto,
        Some(v) => match crate::overlay::options::PassthroughChoice::parse("passthrough", v) {
            Ok(p) => p,
            Err(_) => {
                bad.add("passthrough", format!("{v:?}: want auto, on or off"));
                crate::overlay::options::PassthroughChoice::Auto
            }
        },
    };
    let save = match rc.save.as_deref() {
        None | Some("miss") => SaveWhen::Miss,
        Some("success") => SaveWhen::Success,
        Some(v) => {
            bad.add(
                "save",
                format!(
                    "{v:?}: want \"miss\" (promote setup's tree only; the default) or \"success\" \
                     (also promote the view again after COMMAND exits 0)"
                ),
            );
            SaveWhen::Miss
        }
    };
    match id {
        Some(id) if bad.errors.is_empty() => Ok(Cache {
            id,
            preset,
            setup,
            restore_setup,
            maintenance,
            key_files,
            key_files_explicit,
            key_files_first: !key_files_explicit && preset.is_some_and(|p| p.key_files_first),
            requirement_includes: preset.is_some_and(|p| p.requirement_includes),
            restore_keys: rc.restore_keys,
            env,
            mountpoint,
            exclude,
            relocatable,
            passthrough,
            save,
        }),
        _ => Err(bad.errors),
    }
}

/// The messages of one cache's bad fields, in the order they are found.
struct Problems {
    i: usize,
    errors: Vec<String>,
}

impl Problems {
    /// Records `cache[i].<field>: <msg>`.
    fn add(&mut self, field: &str, msg: String) {
        self.errors
            .push(format!("cache[{}].{field}: {msg}", self.i));
    }
}

/// The cache's `id`: valid, and not one of `before`'s.
fn cache_id(id: String, before: &[(usize, String)], bad: &mut Problems) -> Option<CacheId> {
    let id = match CacheId::new(id) {
        Ok(id) => Some(id),
        Err(e) => {
            bad.add("id", e.to_string());
            None
        }
    };
    if let Some(id) = &id
        && let Some((j, _)) = before.iter().find(|(_, b)| b == id.as_str())
    {
        bad.add(
            "id",
            format!("duplicate id {:?} (also cache[{j}].id)", id.as_str()),
        );
    }
    id
}

/// The named preset, and whether the name is unknown (then the fields it would fill are not
/// checked: its defaults are unknown).
fn cache_preset(name: Option<&str>, bad: &mut Problems) -> (Option<&'static Preset>, bool) {
    let Some(name) = name else {
        return (None, false);
    };
    match preset(name) {
        Some(p) => (Some(p), false),
        None => {
            let known: Vec<&str> = PRESETS.iter().map(|p| p.name).collect();
            bad.add(
                "preset",
                format!("unknown preset {name:?} (known: {})", known.join(", ")),
            );
            (None, true)
        }
    }
}

/// `setup`, `restore_setup` and `maintenance` as written, else the preset's.
fn scripts(
    (setup, restore_setup, maintenance): (Option<String>, Option<String>, Option<String>),
    preset: Option<&'static Preset>,
    unknown_preset: bool,
    bad: &mut Problems,
) -> (String, Option<String>, Option<String>) {
    let setup = match (setup, preset) {
        (Some(s), _) if s.trim().is_empty() => {
            bad.add("setup", "must not be empty".into());
            String::new()
        }
        (Some(s), _) => s,
        (None, Some(p)) => p.setup.to_string(),
        (None, None) => {
            if !unknown_preset {
                bad.add(
                    "setup",
                    "missing: a cache without a preset needs a setup script".into(),
                );
            }
            String::new()
        }
    };
    let restore_setup = match (restore_setup, preset) {
        (Some(s), _) if s.trim().is_empty() => {
            bad.add("restore_setup", "must not be empty".into());
            None
        }
        (Some(s), _) => Some(s),
        // A spec's own setup is also its restore script unless it names one.
        (None, Some(p)) if setup == p.setup => p.restore_setup.map(str::to_string),
        (None, _) => None,
    };
    let maintenance = match maintenance {
        Some(m) if m.trim().is_empty() => None,
        Some(m) => Some(m),
        None => preset.and_then(|p| p.maintenance.map(str::to_string)),
    };
    (setup, restore_setup, maintenance)
}

/// The key's inputs: `key_files` as written (else the preset's; at least one, each relative)
/// and `restore_keys` (each a valid key).
fn key_inputs(
    key_files: Option<Vec<String>>,
    restore_keys: &Option<Vec<String>>,
    preset: Option<&'static Preset>,
    unknown_preset: bool,
    bad: &mut Problems,
) -> Vec<String> {
    let key_files: Vec<String> = match key_files {
        Some(k) => k,
        None => preset
            .map(|p| p.key_files.iter().map(|s| s.to_string()).collect())
            .unwrap_or_default(),
    };
    if key_files.is_empty() && !unknown_preset {
        bad.add(
            "key_files",
            "missing: name at least one lockfile (or use a preset)".into(),
        );
    }
    for k in &key_files {
        if let Err(m) = check_relative(k) {
            bad.add("key_files", format!("{k:?}: {m}"));
        }
    }
    for rk in restore_keys.iter().flatten() {
        if let Err(e) = CacheKey::new(rk.clone()) {
            bad.add("restore_keys", e.to_string());
        }
    }
    key_files
}

/// The preset's `env` with the spec's over it (each name a valid variable name).
fn cache_env(
    own: BTreeMap<String, String>,
    preset: Option<&'static Preset>,
    bad: &mut Problems,
) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = preset
        .map(|p| {
            p.env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .unwrap_or_default();
    for (k, v) in own {
        let valid = !k.is_empty()
            && !k.as_bytes()[0].is_ascii_digit()
            && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !valid {
            bad.add(
                "env",
                format!("{k:?} is not a valid variable name (letters, digits, _)"),
            );
        }
        env.insert(k, v);
    }
    env
}

/// Where the tree is seen (`mountpoint`, else the preset's; [`check_mountpoint`]) and what is
/// left out of it (the preset's `exclude` plus the spec's, each relative).
fn tree_paths(
    mountpoint: Option<String>,
    own_exclude: Vec<String>,
    preset: Option<&'static Preset>,
    bad: &mut Problems,
) -> (Option<String>, Vec<String>) {
    let mountpoint = mountpoint.or_else(|| preset.and_then(|p| p.mountpoint.map(str::to_string)));
    if let Some(mp) = &mountpoint
        && let Err(m) = check_mountpoint(mp)
    {
        bad.add("mountpoint", m);
    }
    let mut exclude: Vec<String> = preset
        .map(|p| p.exclude.iter().map(|s| s.to_string()).collect())
        .unwrap_or_default();
    for x in own_exclude {
        if let Err(m) = check_relative(&x) {
            bad.add("exclude", format!("{x:?}: {m}"));
        }
        exclude.push(x);
    }
    (mountpoint, exclude)
}

/// The checks of a `mountpoint` template that need no paths, shared by `layercache run` (at
/// spec load) and the API/editor ([`parse_all`]): it is absolute or starts with `{workdir}` or
/// `{mount_root}`, has no `..`, is strictly below `{workdir}`/`{mount_root}` (not the directory
/// itself), and a literal absolute path is none that [`check_root`] refuses (`/`, a top-level
/// system directory, anything under `/etc`, `/usr`, `/proc`, …): no mount root or workdir can
/// hold those. What depends on the run's paths (an absolute path below neither `--mount-root`
/// nor the workdir) is checked by [`Cache::mountpoint`] when the run starts.
///
/// Errors: a message naming the mountpoint and what would be valid.
fn check_mountpoint(mp: &str) -> std::result::Result<(), String> {
    if !(mp.starts_with('/') || mp.starts_with("{workdir}") || mp.starts_with("{mount_root}"))
        || mp.split('/').any(|c| c == "..")
    {
        return Err(format!(
            "{mp:?} must be absolute or start with {{workdir}} or {{mount_root}}, without '..'"
        ));
    }
    let bare = mp.trim_end_matches('/');
    if bare == "{workdir}" || bare == "{mount_root}" {
        return Err(format!(
            "{mp:?} is the directory itself: a cache mounts strictly below it (e.g. \
             \"{bare}/name\")"
        ));
    }
    // The literal part before any template: complete components only.
    let literal = match mp.find('{') {
        None if bare.is_empty() => "/",
        None => bare,
        Some(at) => &mp[..mp[..at].rfind('/').unwrap_or(0)],
    };
    let literal = Path::new(literal);
    let system = literal.is_absolute() && SYSTEM_DIRS.iter().any(|d| literal.starts_with(d));
    let top = !mp.contains('{') && TOP_DIRS.iter().any(|d| literal == Path::new(d));
    if system || top {
        return Err(format!(
            "{mp:?} is refused: a system directory (or /) cannot hold a cache mount; a cache \
             mounts only below the mount root (--mount-root, default /cache) or the workdir, \
             e.g. \"{{mount_root}}/name\" or \"{{workdir}}/name\""
        ));
    }
    Ok(())
}

/// A key-file or exclude pattern must be relative, without `..`, and a valid glob.
fn check_relative(p: &str) -> std::result::Result<(), String> {
    if p.is_empty() || p.starts_with('/') || p.split('/').any(|c| c == "..") {
        return Err("must be a relative path without '..'".into());
    }
    Pattern::new(p).map(drop)
}
