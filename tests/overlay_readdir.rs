//! Merged readdir: upper and lower entries, no duplicates, whiteouts hidden, deletion during
//! iteration, 6,000-entry directories, stable offsets, d_ino == st_ino (issue 2).

#[macro_use]
mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CStr;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::*;

/// One entry as returned by readdir(3).
#[derive(Clone, Debug)]
struct Entry {
    name: String,
    ino: u64,
    ty: u8,
}

/// A directory stream (opendir/readdir/telldir/seekdir) closed on drop.
struct Dir(*mut libc::DIR);

impl Dir {
    fn open(p: &Path) -> Dir {
        let c = cstr(p);
        // SAFETY: valid C string.
        let d = unsafe { libc::opendir(c.as_ptr()) };
        assert!(!d.is_null(), "opendir {}: errno {}", p.display(), errno());
        Dir(d)
    }

    fn next(&mut self) -> Option<Entry> {
        // SAFETY: self.0 is an open stream; errno is reset to tell end from error.
        unsafe {
            *libc::__errno_location() = 0;
            let e = libc::readdir64(self.0);
            if e.is_null() {
                assert_eq!(errno(), 0, "readdir failed");
                return None;
            }
            let e = &*e;
            Some(Entry {
                name: CStr::from_ptr(e.d_name.as_ptr())
                    .to_string_lossy()
                    .into_owned(),
                ino: e.d_ino,
                ty: e.d_type,
            })
        }
    }

    fn tell(&mut self) -> libc::c_long {
        // SAFETY: open stream.
        unsafe { libc::telldir(self.0) }
    }

    fn seek(&mut self, pos: libc::c_long) {
        // SAFETY: open stream; pos came from telldir on it.
        unsafe { libc::seekdir(self.0, pos) }
    }

    fn rewind(&mut self) {
        // SAFETY: open stream.
        unsafe { libc::rewinddir(self.0) }
    }

    fn rest(&mut self) -> Vec<Entry> {
        std::iter::from_fn(|| self.next()).collect()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        // SAFETY: open stream, closed once.
        unsafe { libc::closedir(self.0) };
    }
}

/// Every entry (without . and ..), asserting there are no duplicates and no whiteouts.
fn entries(p: &Path) -> Vec<Entry> {
    let all = Dir::open(p).rest();
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for e in all {
        assert!(
            seen.insert(e.name.clone()),
            "{}: duplicate entry {:?}",
            p.display(),
            e.name
        );
        assert_ne!(
            e.ty,
            libc::DT_CHR,
            "{}: whiteout-like entry {:?} visible",
            p.display(),
            e.name
        );
        if e.name != "." && e.name != ".." {
            out.push(e);
        }
    }
    assert!(
        seen.contains(".") && seen.contains(".."),
        "{}: . and .. missing",
        p.display()
    );
    out
}

fn entry_names(p: &Path) -> Vec<String> {
    let mut v: Vec<String> = entries(p).into_iter().map(|e| e.name).collect();
    v.sort();
    v
}

#[test]
fn merged_readdir_no_duplicates_across_two_lowers_and_upper() {
    require_root!();
    let mut fx = Fixture::builder().lowers(2).build(|l| {
        write(&l[0].join("a"), "a");
        write(&l[0].join("shared"), "top");
        write(&l[0].join("dir/x"), "top x");
        write(&l[1].join("b"), "b");
        write(&l[1].join("shared"), "bottom");
        write(&l[1].join("dir/x"), "bottom x");
        write(&l[1].join("dir/y"), "y");
    });
    assert_eq!(entry_names(&fx.mnt), ["a", "b", "dir", "shared"]);
    assert_eq!(entry_names(&fx.p("dir")), ["x", "y"]);
    assert_eq!(read(&fx.p("shared")), "top", "the topmost lower wins");
    assert_eq!(read(&fx.p("dir/x")), "top x");
    write(&fx.p("c"), "c");
    write(&fx.p("b"), "b2");
    write(&fx.p("dir/z"), "z");
    write(&fx.p("shared"), "upper");
    for round in 0..2 {
        assert_eq!(
            entry_names(&fx.mnt),
            ["a", "b", "c", "dir", "shared"],
            "round {round}"
        );
        assert_eq!(entry_names(&fx.p("dir")), ["x", "y", "z"], "round {round}");
        assert_eq!(read(&fx.p("shared")), "upper");
        assert_eq!(read(&fx.p("b")), "b2");
        fx.remount();
    }
}

#[test]
fn whiteouts_hidden_from_readdir() {
    require_root!();
    let mut fx = Fixture::builder().lowers(2).build(|l| {
        write(&l[0].join("a"), "a");
        write(&l[0].join("d/x"), "x");
        write(&l[1].join("b"), "b");
        write(&l[1].join("d/y"), "y");
        write(&l[1].join("keep"), "keep");
    });
    for n in ["a", "b", "d/x", "d/y"] {
        fs::remove_file(fx.p(n)).unwrap();
    }
    for round in 0..2 {
        assert_eq!(entry_names(&fx.mnt), ["d", "keep"], "round {round}");
        assert_eq!(
            entry_names(&fx.p("d")),
            Vec::<String>::new(),
            "round {round}"
        );
        fx.remount();
    }
    // A merged directory whose entries are all whited out is empty: rmdir works.
    fs::remove_dir(fx.p("d")).unwrap();
    fx.remount();
    assert_eq!(entry_names(&fx.mnt), ["keep"]);
}

#[test]
fn readdir_while_deleting_entries() {
    require_root!();
    let fx = Fixture::new(|l| {
        for i in 0..300 {
            write(&l.join(format!("d/low{i:03}")), "l");
        }
        for i in 0..20 {
            write(&l.join(format!("d/keep{i:02}")), "k");
        }
    });
    for i in 0..300 {
        write(&fx.p(&format!("d/up{i:03}")), "u");
    }
    let d = fx.p("d");
    let all: BTreeSet<String> = entry_names(&d).into_iter().collect();
    assert_eq!(all.len(), 620);
    let mut ahead: Vec<String> = all
        .iter()
        .filter(|n| !n.starts_with("keep"))
        .cloned()
        .collect();
    let mut deleted = BTreeSet::new();
    let mut seen = BTreeSet::new();
    let mut dir = Dir::open(&d);
    while let Some(e) = dir.next() {
        if e.name == "." || e.name == ".." {
            continue;
        }
        assert!(seen.insert(e.name.clone()), "{:?} returned twice", e.name);
        assert!(all.contains(&e.name), "unknown entry {:?}", e.name);
        if e.name.starts_with("keep") {
            continue;
        }
        // The rm -rf pattern: unlink what was just returned, and one entry not yet returned.
        if deleted.insert(e.name.clone()) {
            fs::remove_file(d.join(&e.name)).unwrap();
        }
        while let Some(n) = ahead.pop() {
            if !seen.contains(&n) && deleted.insert(n.clone()) {
                fs::remove_file(d.join(&n)).unwrap();
                break;
            }
        }
    }
    drop(dir);
    for i in 0..20 {
        assert!(
            seen.contains(&format!("keep{i:02}")),
            "keep{i:02} never returned"
        );
    }
    let left = entry_names(&d);
    let want: Vec<String> = (0..20).map(|i| format!("keep{i:02}")).collect();
    assert_eq!(left, want);
    // Now rm -rf style: every entry returned once, unlinked as it is returned.
    let mut dir = Dir::open(&d);
    let mut n = 0;
    while let Some(e) = dir.next() {
        if e.name != "." && e.name != ".." {
            fs::remove_file(d.join(&e.name)).unwrap();
            n += 1;
        }
    }
    assert_eq!(n, 20);
    drop(dir);
    fs::remove_dir(&d).unwrap();
}

#[test]
fn readdir_6000_entries() {
    require_root!();
    let mut fx = Fixture::new(|l| {
        fs::create_dir(l.join("big")).unwrap();
        for i in 0..6000 {
            fs::write(l.join(format!("big/entry-{i:05}")), "").unwrap();
        }
    });
    assert_eq!(entries(&fx.p("big")).len(), 6000);
    // Delete 1000, copy up 1000, create 1000: still 6000 entries.
    for i in 0..1000 {
        fs::remove_file(fx.p(&format!("big/entry-{i:05}"))).unwrap();
        fs::write(fx.p(&format!("big/entry-{:05}", 1000 + i)), "copied up").unwrap();
        fs::write(fx.p(&format!("big/new-{i:05}")), "").unwrap();
    }
    let mut want: BTreeSet<String> = (1000..6000).map(|i| format!("entry-{i:05}")).collect();
    want.extend((0..1000).map(|i| format!("new-{i:05}")));
    for round in 0..2 {
        let got: Vec<String> = entry_names(&fx.p("big"));
        assert_eq!(got.len(), 6000, "round {round}");
        assert!(
            got.iter().cloned().collect::<BTreeSet<_>>() == want,
            "round {round}: names"
        );
        fx.remount();
    }
}

#[test]
fn readdir_offsets_are_stable() {
    require_root!();
    let fx = Fixture::new(|l| {
        for i in 0..150 {
            write(&l.join(format!("d/l{i:03}")), "");
        }
    });
    for i in 0..150 {
        write(&fx.p(&format!("d/u{i:03}")), "");
    }
    for i in 0..20 {
        fs::remove_file(fx.p(&format!("d/l{i:03}"))).unwrap();
    }
    let mut dir = Dir::open(&fx.p("d"));
    let first: Vec<String> = (0..100).map(|_| dir.next().unwrap().name).collect();
    let pos = dir.tell();
    let rest_a: Vec<String> = dir.rest().into_iter().map(|e| e.name).collect();
    dir.seek(pos);
    let rest_b: Vec<String> = dir.rest().into_iter().map(|e| e.name).collect();
    assert_eq!(rest_a, rest_b, "entries after seekdir(telldir()) differ");
    dir.rewind();
    let again: Vec<String> = dir.rest().into_iter().map(|e| e.name).collect();
    let mut once: Vec<String> = first.clone();
    once.extend(rest_a);
    assert_eq!(again, once, "rewinddir gives the same sequence");
    assert_eq!(once.len(), 282, "280 entries + . and ..");
}

#[test]
fn d_ino_equals_st_ino() {
    require_root!();
    let fx = Fixture::new(|l| {
        write(&l.join("lower_file"), "l");
        write(&l.join("copied"), "c");
        write(&l.join("sub/inner"), "i");
        fs::create_dir(l.join("lower_dir")).unwrap();
        std::os::unix::fs::symlink("lower_file", l.join("link")).unwrap();
    });
    write(&fx.p("copied"), "changed");
    write(&fx.p("upper_file"), "u");
    fs::create_dir(fx.p("upper_dir")).unwrap();
    write(&fx.p("sub/new"), "n");
    write(&fx.p("sub/inner"), "changed");
    for dir in [fx.mnt.clone(), fx.p("sub")] {
        let mut seen = BTreeMap::new();
        for e in Dir::open(&dir).rest() {
            let st = match e.name.as_str() {
                ".." => continue,
                "." => fs::metadata(&dir).unwrap(),
                n => fs::symlink_metadata(dir.join(n)).unwrap(),
            };
            seen.insert(e.name.clone(), (e.ino, st.ino()));
        }
        for (name, (d_ino, st_ino)) in &seen {
            assert_eq!(
                d_ino,
                st_ino,
                "{}: d_ino != st_ino for {name:?}",
                dir.display()
            );
        }
        assert!(seen.len() >= 3);
    }
}

/// xfstests generic/736 (src/readdir-while-renames.c): a reader renames every entry it reads
/// to a temporary name and back while the directory stream stays open. Each rename removes
/// the name and creates it again, so a listing that put re-created names at its end kept
/// handing the reader the names it had just renamed (over 15,000 entries for 5,000 files).
/// Every name must be read, none twice (ext4 returns each once, like kernel overlayfs on it).
#[test]
fn readdir_while_renaming_every_entry_reads_each_once() {
    require_root!();
    const LOWER: usize = 1500;
    const UPPER: usize = 1500;
    let mut fx = Fixture::new(|l| {
        fs::create_dir(l.join("d")).unwrap();
        for i in 0..LOWER {
            write(&l.join(format!("d/l{i}")), "");
        }
    });
    for i in 0..UPPER {
        write(&fx.p(&format!("d/u{i}")), "");
    }
    // A fresh mount too: its listing is built from the layers, not grown by the creates.
    for round in 0..2 {
        if round == 1 {
            fx.remount();
        }
        let dir = fx.p("d");
        let mut d = Dir::open(&dir);
        let mut seen = BTreeMap::<String, usize>::new();
        let mut count = 0;
        while let Some(e) = d.next() {
            count += 1;
            assert!(
                count <= 3 * (LOWER + UPPER),
                "round {round}: over {count} entries read for {} names",
                LOWER + UPPER
            );
            if e.name == "." || e.name == ".." {
                continue;
            }
            *seen.entry(e.name.clone()).or_default() += 1;
            fs::rename(dir.join(&e.name), dir.join("TEMPFILE")).unwrap();
            fs::rename(dir.join("TEMPFILE"), dir.join(&e.name)).unwrap();
        }
        let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).take(5).collect();
        assert!(
            twice.is_empty(),
            "round {round}: read more than once: {twice:?}"
        );
        assert_eq!(seen.len(), LOWER + UPPER, "round {round}: names read");
        assert!(!seen.contains_key("TEMPFILE"), "round {round}");
    }
}
