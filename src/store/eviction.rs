//! Eviction policy: least-recently-used layers (by last mount time) go first until the store is
//! under its byte, inode and age limits — actions/cache's LRU eviction, with bytes counted once
//! per object (a file shared by hardlink between layer versions is counted once), and never a
//! layer that is leased (mounted).
//!
//! This module holds the pure planning function over the limits of config.toml
//! ([`super::config::Limits`]); [`super::Store::gc`] gathers the usage and carries the plan out.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde::Serialize;

use super::config::Limits;

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
