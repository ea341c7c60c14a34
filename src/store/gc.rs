//! Eviction policy: least-recently-used layers (by last mount time) go first until the store is
//! under its byte, inode and age limits — actions/cache's LRU eviction, with bytes counted once
//! per object (a file shared by hardlink between layer versions is counted once), and never a
//! layer that is leased (mounted).
//!
//! This module holds the limits (`<store>/v1/config.toml`), their parsers and the pure planning
//! function; [`super::Store::gc`] gathers the usage and carries the plan out.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Default byte limit (20 GiB).
pub const DEFAULT_MAX_SIZE: u64 = 20 << 30;
/// Default inode limit.
pub const DEFAULT_MAX_INODES: u64 = 5_000_000;
/// Default age limit (30 days since last mount).
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(30 * 86_400);

/// The store limits. `None` = unlimited.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Limits {
    /// Total bytes of objects (each object once).
    pub max_size: Option<u64>,
    /// Total inodes (objects, directories, symlinks of all layer trees).
    pub max_inodes: Option<u64>,
    /// Evict layers not mounted for longer than this.
    pub max_age: Option<Duration>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_size: Some(DEFAULT_MAX_SIZE),
            max_inodes: Some(DEFAULT_MAX_INODES),
            max_age: Some(DEFAULT_MAX_AGE),
        }
    }
}

/// `<store>/v1/config.toml` as written by users: sizes and durations as strings.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// `[limits]`.
    #[serde(default)]
    pub limits: LimitsFile,
    /// `[remote]`: the remote tier (issue 14), see [`crate::remote::config`].
    #[serde(default)]
    pub remote: Option<crate::remote::config::RemoteFile>,
}

/// `[limits]` of config.toml: `max_size = "20G"`, `max_inodes = 5000000`, `max_age = "30d"`;
/// `"none"` (or 0) disables a limit.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsFile {
    /// e.g. "20G".
    pub max_size: Option<String>,
    /// e.g. 5000000; `"none"` is read as 0 (no limit).
    #[serde(default, deserialize_with = "count_or_none")]
    pub max_inodes: Option<u64>,
    /// e.g. "30d".
    pub max_age: Option<String>,
}

/// Whether a limit's value is the word `none` (any case, surrounding blanks ignored), which
/// disables the limit in config.toml and on the command line.
pub fn means_no_limit(s: &str) -> bool {
    s.trim().eq_ignore_ascii_case("none")
}

/// Parses an inode limit as the command line takes it: a whole number, or `none`; `none` or 0
/// → `None` (unlimited).
///
/// Errors: a message naming the input, e.g. `"-1" is not a whole number (want 0, 1, 2, …) or
/// "none"`.
pub fn parse_count(s: &str) -> std::result::Result<Option<u64>, String> {
    if means_no_limit(s) {
        return Ok(None);
    }
    match s.parse::<u64>() {
        Ok(0) => Ok(None),
        Ok(n) => Ok(Some(n)),
        Err(_) => Err(format!(
            "{s:?} is not a whole number (want 0, 1, 2, …) or \"none\""
        )),
    }
}

/// Reads `max_inodes` as a whole number or the string `"none"` (→ 0, no limit), like the
/// other limits take `"none"`.
///
/// Errors: a serde error naming what was found, e.g. `"lots"`.
fn count_or_none<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<u64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum CountOrNone {
        Count(u64),
        Negative(i64),
        Word(String),
    }
    let bad = |shown: String| {
        serde::de::Error::custom(format!(
            "max_inodes = {shown}: want a whole number or \"none\""
        ))
    };
    match CountOrNone::deserialize(d)? {
        CountOrNone::Count(n) => Ok(Some(n)),
        CountOrNone::Word(w) if means_no_limit(&w) => Ok(Some(0)),
        CountOrNone::Word(w) => Err(bad(format!("{w:?}"))),
        CountOrNone::Negative(n) => Err(bad(n.to_string())),
    }
}

/// The config.toml written into a new store.
pub const DEFAULT_CONFIG_TOML: &str = "\
# layercache store configuration. Sizes: 512M, 20G (binary units); durations: 90m, 12h, 30d.
# \"none\" disables a limit. `layercache gc` flags override these for one run.
[limits]
max_size = \"20G\"
max_inodes = 5000000
max_age = \"30d\"
";

impl LimitsFile {
    /// Validates into [`Limits`]; missing entries take the defaults.
    ///
    /// Errors: [`Error::Invalid`] naming the bad value.
    pub fn resolve(&self) -> Result<Limits> {
        let d = Limits::default();
        Ok(Limits {
            max_size: match &self.max_size {
                Some(s) => parse_size(s)?,
                None => d.max_size,
            },
            max_inodes: match self.max_inodes {
                Some(0) => None,
                Some(n) => Some(n),
                None => d.max_inodes,
            },
            max_age: match &self.max_age {
                Some(s) => parse_duration(s)?,
                None => d.max_age,
            },
        })
    }
}

/// Parses a size: a number with an optional binary unit `K`, `M`, `G`, `T` (optionally followed
/// by `i`/`B`, e.g. `10G`, `512MiB`, `4096`); `none` or `0` → `None` (unlimited).
///
/// Hand-written rather than bytesize: bytesize reads `20G`/`20GB` as decimal (10^9) units,
/// while config.toml and `--max-size` have always meant binary ones.
///
/// Errors: [`Error::Invalid`] naming the input.
pub fn parse_size(s: &str) -> Result<Option<u64>> {
    let t = s.trim();
    if means_no_limit(t) {
        return Ok(None);
    }
    let bad = || {
        Error::invalid(format!(
            "invalid size {s:?}: want e.g. 512M, 20G, 4096 or none"
        ))
    };
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| bad())?;
    let unit = unit.trim().to_ascii_uppercase();
    let unit = unit.trim_end_matches('B').trim_end_matches('I');
    let mult: u64 = match unit {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        _ => return Err(bad()),
    };
    let v = n.checked_mul(mult).ok_or_else(bad)?;
    Ok(if v == 0 { None } else { Some(v) })
}

/// Parses a duration: a number of seconds, or humantime's syntax (`30d`, `12h`, `90m`,
/// `3600s`, `1w`, `1h 30m`); `none` or `0` → `None` (unlimited).
///
/// Errors: [`Error::Invalid`] naming the input.
pub fn parse_duration(s: &str) -> Result<Option<Duration>> {
    let t = s.trim();
    if means_no_limit(t) {
        return Ok(None);
    }
    let d = match t.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => humantime::parse_duration(t).map_err(|e| {
            Error::invalid(format!(
                "invalid duration {s:?} ({e}): want e.g. 3600s, 90m, 12h, 30d or none"
            ))
        })?,
    };
    Ok((!d.is_zero()).then_some(d))
}

/// One layer as the planner sees it.
#[derive(Clone, Debug)]
pub struct Candidate {
    /// Opaque index the caller maps back to its layer.
    pub index: usize,
    /// Time since last mount.
    pub idle: Duration,
    /// Leased (mounted): never evicted.
    pub in_use: bool,
    /// Objects (inode numbers, unique within a project) its tree links to, with their sizes.
    pub objects: Vec<(u64, u64)>,
    /// Inodes its tree owns alone (directories, symlinks, fifos).
    pub own_inodes: u64,
    /// Project index: objects are only shared inside a project.
    pub project: usize,
}

/// Store totals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Bytes of objects (each once).
    pub bytes: u64,
    /// Inodes: objects + tree directories/symlinks/fifos.
    pub inodes: u64,
    /// Layers.
    pub layers: u64,
}

/// Usage of `cands`, bytes and inodes of shared objects counted once.
pub fn usage(cands: &[Candidate]) -> Usage {
    let mut seen = HashSet::new();
    let mut u = Usage::default();
    for c in cands {
        u.layers += 1;
        u.inodes += c.own_inodes;
        for &(ino, size) in &c.objects {
            if seen.insert((c.project, ino)) {
                u.bytes += size;
                u.inodes += 1;
            }
        }
    }
    u
}

/// Chooses layers to evict: first every idle-longer-than-`max_age` layer, then least recently
/// used first until bytes and inodes are under their limits. Leased layers are skipped. Returns
/// the chosen `index`es in eviction order and the usage after eviction.
pub fn plan(cands: &[Candidate], limits: &Limits) -> (Vec<usize>, Usage) {
    let mut refs: HashMap<(usize, u64), (u32, u64)> = HashMap::new();
    for c in cands {
        for &(ino, size) in &c.objects {
            refs.entry((c.project, ino)).or_insert((0, size)).0 += 1;
        }
    }
    let mut u = usage(cands);
    let mut order: Vec<&Candidate> = cands.iter().filter(|c| !c.in_use).collect();
    order.sort_by(|a, b| b.idle.cmp(&a.idle).then(a.index.cmp(&b.index)));
    let mut evicted = Vec::new();
    for c in order {
        let too_old = limits.max_age.is_some_and(|a| c.idle > a);
        let too_big = limits.max_size.is_some_and(|m| u.bytes > m);
        let too_many = limits.max_inodes.is_some_and(|m| u.inodes > m);
        if !(too_old || too_big || too_many) {
            continue;
        }
        evicted.push(c.index);
        u.layers -= 1;
        u.inodes -= c.own_inodes;
        for &(ino, _) in &c.objects {
            if let Some(r) = refs.get_mut(&(c.project, ino)) {
                r.0 -= 1;
                if r.0 == 0 {
                    u.bytes -= r.1;
                    u.inodes -= 1;
                }
            }
        }
    }
    (evicted, u)
}

/// True when `u` is at most half of every byte and inode limit: with `u` an upper bound of the
/// usage ([`super::Store::usage_bound`]), the store is surely under its limits, with room for
/// what the bound leaves out (objects no layer links).
pub fn well_below_limits(u: &Usage, limits: &Limits) -> bool {
    limits.max_size.is_none_or(|m| u.bytes <= m / 2)
        && limits.max_inodes.is_none_or(|m| u.inodes <= m / 2)
}

/// True when `u` exceeds a byte or inode limit (age is checked per layer by [`plan`]).
pub fn over_limits(u: &Usage, limits: &Limits) -> bool {
    limits.max_size.is_some_and(|m| u.bytes > m) || limits.max_inodes.is_some_and(|m| u.inodes > m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(index: usize, idle_s: u64, in_use: bool, objects: &[(u64, u64)]) -> Candidate {
        Candidate {
            index,
            idle: Duration::from_secs(idle_s),
            in_use,
            objects: objects.to_vec(),
            own_inodes: 1,
            project: 0,
        }
    }

    fn limits(size: Option<u64>) -> Limits {
        Limits {
            max_size: size,
            max_inodes: None,
            max_age: None,
        }
    }

    #[test]
    fn parses_sizes_and_durations() {
        assert_eq!(parse_size("10G").unwrap(), Some(10 << 30));
        assert_eq!(parse_size("512MiB").unwrap(), Some(512 << 20));
        assert_eq!(parse_size("4096").unwrap(), Some(4096));
        assert_eq!(parse_size("none").unwrap(), None);
        assert!(parse_size("10X").unwrap_err().to_string().contains("10X"));
        assert_eq!(
            parse_duration("30d").unwrap(),
            Some(Duration::from_secs(30 * 86400))
        );
        assert_eq!(
            parse_duration("90m").unwrap(),
            Some(Duration::from_secs(5400))
        );
        assert!(parse_duration("-1h").is_err());
        let f: ConfigFile = toml::from_str(DEFAULT_CONFIG_TOML).unwrap();
        assert_eq!(f.limits.resolve().unwrap(), Limits::default());
        // "none" disables the inode limit as it does the others; other words are refused.
        let f: ConfigFile =
            toml::from_str("[limits]\nmax_inodes = \"none\"\nmax_size = \"none\"\n").unwrap();
        let l = f.limits.resolve().unwrap();
        assert_eq!((l.max_inodes, l.max_size), (None, None));
        let e = toml::from_str::<ConfigFile>("[limits]\nmax_inodes = \"lots\"\n").unwrap_err();
        assert!(e.to_string().contains("lots"), "{e}");
        let e = toml::from_str::<ConfigFile>("[limits]\nmax_inodes = -1\n").unwrap_err();
        assert!(
            e.to_string()
                .contains("max_inodes = -1: want a whole number"),
            "{e}"
        );
    }

    #[test]
    fn evicts_least_recently_used_first_and_skips_leased() {
        let c = vec![
            cand(0, 10, false, &[(1, 100)]),
            cand(1, 1000, true, &[(2, 100)]), // oldest but mounted
            cand(2, 500, false, &[(3, 100)]),
            cand(3, 50, false, &[(4, 100)]),
        ];
        let (ev, u) = plan(&c, &limits(Some(250)));
        assert_eq!(ev, vec![2, 3]);
        assert_eq!(u.bytes, 200);
    }

    #[test]
    fn shared_objects_count_once() {
        // Two versions share object 1 (900 bytes); only the 100-byte objects differ.
        let c = vec![
            cand(0, 100, false, &[(1, 900), (2, 100)]),
            cand(1, 1, false, &[(1, 900), (3, 100)]),
        ];
        assert_eq!(usage(&c).bytes, 1100);
        let (ev, u) = plan(&c, &limits(Some(1000)));
        assert_eq!(ev, vec![0]);
        assert_eq!(u.bytes, 1000);
        assert_eq!(plan(&c, &limits(Some(1100))).0, Vec::<usize>::new());
    }

    #[test]
    fn age_and_inode_limits() {
        let c = vec![
            cand(0, 90_000, false, &[(1, 1)]),
            cand(1, 10, false, &[(2, 1)]),
        ];
        let l = Limits {
            max_size: None,
            max_inodes: None,
            max_age: Some(Duration::from_secs(86_400)),
        };
        assert_eq!(plan(&c, &l).0, vec![0]);
        let l = Limits {
            max_size: None,
            max_inodes: Some(2),
            max_age: None,
        };
        let (ev, u) = plan(&c, &l);
        assert_eq!((ev, u.inodes), (vec![0], 2));
    }
}
