use super::*;
use std::fs;

/// Three layers under one temp dir: `upper`, `l0` (top lower) and `l1`.
struct Fx {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

impl Fx {
    fn new() -> Fx {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        for d in ["upper", "l0", "l1"] {
            fs::create_dir(root.join(d)).unwrap();
        }
        Fx { _dir: dir, root }
    }
    fn file(&self, rel: &str) {
        let p = self.root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, rel).unwrap();
    }
    fn dir(&self, rel: &str) {
        fs::create_dir_all(self.root.join(rel)).unwrap();
    }
    fn whiteout(&self, rel: &str) {
        let p = self.root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        whiteout::create_whiteout_at(libc::AT_FDCWD, &crate::sys::cstr(p.as_os_str()).unwrap())
            .unwrap();
    }
    fn opaque(&self, rel: &str) {
        let d = File::open(self.root.join(rel)).unwrap();
        whiteout::set_opaque(d.as_fd()).unwrap();
    }
    fn stack(&self) -> Stack {
        let (l0, l1) = (self.root.join("l0"), self.root.join("l1"));
        Stack::open_merge(Some(&self.root.join("upper")), &[&l0, &l1]).unwrap()
    }
}

fn names(s: &Stack, rel: &CStr) -> Vec<String> {
    let mut v: Vec<String> = s
        .merged_names(true, s.all_lowers(), rel)
        .unwrap()
        .into_iter()
        .map(|(n, _)| n.to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn root() -> bool {
    // Whiteouts (mknod) and trusted.* xattrs need root, as the overlay does.
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn upper_hides_lower_and_directories_merge() {
    let fx = Fx::new();
    fx.file("upper/f");
    fx.file("l0/f");
    fx.dir("upper/d");
    fx.file("l0/d/a");
    fx.file("l1/d/b");
    fx.file("l1/only");
    let s = fx.stack();
    let all = s.all_lowers();
    let f = s.lookup(true, all, c"./f").unwrap().unwrap();
    assert!(f.upper && f.lowers == 0 && f.kind == Kind::File);
    let d = s.lookup(true, all, c"./d").unwrap().unwrap();
    assert!(d.upper && d.kind == Kind::Dir);
    assert_eq!(d.lowers, 0b11, "both lower dirs merge under the upper one");
    assert!(d.lower_ino.is_some());
    let only = s.lookup(true, all, c"./only").unwrap().unwrap();
    assert!(!only.upper && only.lowers == 0b10);
    assert!(s.lookup(true, all, c"./missing").unwrap().is_none());
    assert_eq!(names(&s, c"./d"), ["a", "b"]);
    assert_eq!(names(&s, c"."), ["d", "f", "only"]);
}

#[test]
fn a_non_directory_stops_the_merge() {
    let fx = Fx::new();
    fx.file("l0/x");
    fx.file("l1/x/inside");
    fx.dir("l0/y");
    fx.file("l1/y");
    crate::sys::mkfifo(&fx.root.join("l1/fifo"), 0o644).unwrap();
    let s = fx.stack();
    let x = s.lookup(true, 0b11, c"./x").unwrap().unwrap();
    assert_eq!((x.kind, x.lowers), (Kind::File, 0b01));
    let y = s.lookup(true, 0b11, c"./y").unwrap().unwrap();
    assert_eq!((y.kind, y.lowers), (Kind::Dir, 0b01));
    // Only the layers the parent merges are searched.
    let x1 = s.lookup(false, 0b10, c"./x").unwrap().unwrap();
    assert_eq!((x1.kind, x1.lowers), (Kind::Dir, 0b10));
    let fifo = s.lookup(true, 0b11, c"./fifo").unwrap().unwrap();
    assert_eq!(fifo.kind, Kind::Special(libc::DT_FIFO));
    let listed = s.merged_names(false, 0b10, c".").unwrap();
    assert!(listed.contains(&("fifo".into(), Kind::Special(libc::DT_FIFO))));
}

#[test]
fn whiteouts_and_opaque_directories_hide_lower_entries() {
    if !root() {
        return;
    }
    let fx = Fx::new();
    fx.file("l0/gone");
    fx.whiteout("upper/gone");
    fx.file("l1/deep");
    fx.whiteout("l0/deep");
    fx.dir("upper/o");
    fx.opaque("upper/o");
    fx.file("upper/o/mine");
    fx.file("l0/o/theirs");
    fx.dir("l0/p");
    fx.opaque("l0/p");
    fx.file("l0/p/top");
    fx.file("l1/p/below");
    let s = fx.stack();
    let all = s.all_lowers();
    assert!(s.lookup(true, all, c"./gone").unwrap().is_none());
    assert!(s.lookup(true, all, c"./deep").unwrap().is_none());
    assert!(s.is_whiteout(Tree::Upper, c"./gone").unwrap());
    assert!(
        !s.lower_has(all, c"./deep").unwrap(),
        "a lower whiteout decides"
    );
    assert!(s.lower_has(all, c"./gone").unwrap());
    let o = s.lookup(true, all, c"./o").unwrap().unwrap();
    assert_eq!(
        (o.upper, o.lowers),
        (true, 0),
        "opaque: nothing below merges"
    );
    assert_eq!(names(&s, c"."), ["o", "p"]);
    let p = s.lookup(true, all, c"./p").unwrap().unwrap();
    assert_eq!(
        p.lowers, 0b01,
        "an opaque lower dir hides the lowers below it"
    );
    let merged: Vec<_> = s
        .merged_names(false, p.lowers, c"./p")
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(merged, ["top"]);
    // purge_whiteouts empties a directory of whiteouts only.
    fx.dir("upper/w");
    fx.whiteout("upper/w/x");
    s.purge_whiteouts(c"./w").unwrap();
    assert_eq!(fs::read_dir(fx.root.join("upper/w")).unwrap().count(), 0);
    fx.file("upper/w/real");
    fx.whiteout("upper/w/y");
    let e = s.purge_whiteouts(c"./w").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTEMPTY));
    s.create_whiteout(c"./made").unwrap();
    assert!(s.is_whiteout(Tree::Upper, c"./made").unwrap());
    s.set_opaque(Tree::Upper, c"./w").unwrap();
    assert!(s.is_opaque(Tree::Upper, c"./w").unwrap());
}

/// fuse-overlayfs's file forms, read in every layer: `.wh.NAME` hides NAME below its layer
/// (not beside it), `.wh..wh..opq` makes its directory opaque, `.wh.` names never show; both
/// the lookup by path and the lookup in an open directory follow them. Needs no privilege.
#[test]
fn file_form_whiteouts_and_opaque_markers_hide_lower_entries() {
    let fx = Fx::new();
    fx.file("l0/gone");
    fx.file("upper/.wh.gone");
    fx.file("l1/deep");
    fx.file("l0/.wh.deep");
    // Beside its marker in the same layer a name still shows (a re-created entry).
    fx.file("l0/back");
    fx.file("l0/.wh.back");
    fx.file("l1/back");
    fx.dir("upper/o");
    fx.file("upper/o/.wh..wh..opq");
    fx.file("upper/o/mine");
    fx.file("l0/o/theirs");
    fx.dir("l0/p");
    fx.file("l0/p/.wh..wh..opq");
    fx.file("l0/p/top");
    fx.file("l1/p/below");
    let s = fx.stack();
    let all = s.all_lowers();
    for (name, path) in [(c"gone", c"./gone"), (c"deep", c"./deep")] {
        assert!(s.lookup(true, all, path).unwrap().is_none(), "{name:?}");
        assert!(
            DirFds::new(&s, true, all, c".")
                .lookup(name)
                .unwrap()
                .is_none()
        );
    }
    assert!(
        s.lookup(true, all, c"./.wh.gone").unwrap().is_none(),
        "markers never show"
    );
    assert!(
        DirFds::new(&s, true, all, c".")
            .lookup(c".wh.deep")
            .unwrap()
            .is_none()
    );
    let back = s.lookup(true, all, c"./back").unwrap().unwrap();
    assert_eq!(back.lowers, 0b01);
    assert!(s.is_whiteout(Tree::Upper, c"./gone").unwrap());
    assert_eq!(
        s.upper_whiteout(c"./gone").unwrap(),
        Some(whiteout::Form::File)
    );
    assert!(
        !s.lower_has(all, c"./deep").unwrap(),
        "a lower .wh. file decides"
    );
    assert!(s.lower_has(all, c"./gone").unwrap());
    let o = s.lookup(true, all, c"./o").unwrap().unwrap();
    assert_eq!((o.upper, o.lowers), (true, 0), "opaque by marker file");
    assert_eq!(names(&s, c"."), ["back", "o", "p"]);
    let listed: Vec<_> = s
        .merged_names(true, o.lowers, c"./o")
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(listed, ["mine"]);
    let p = s.lookup(true, all, c"./p").unwrap().unwrap();
    assert_eq!(p.lowers, 0b01);
    // purge_whiteouts removes `.wh.` files and the opaque marker too.
    fx.dir("upper/w");
    fx.file("upper/w/.wh.x");
    fx.file("upper/w/.wh..wh..opq");
    s.purge_whiteouts(c"./w").unwrap();
    assert_eq!(fs::read_dir(fx.root.join("upper/w")).unwrap().count(), 0);
    s.remove_marker(c"./gone").unwrap();
    assert_eq!(s.upper_whiteout(c"./gone").unwrap(), None);
    assert!(s.lookup(true, all, c"./gone").unwrap().is_some());
}

/// The parts of an entry the merge decides (a `libc::stat` has no `PartialEq`).
fn shape(e: Option<Entry>) -> Option<(Kind, bool, u64, Option<u64>, u64)> {
    e.map(|e| (e.kind, e.upper, e.lowers, e.lower_ino, e.st.st_ino))
}

#[test]
fn lookups_in_an_open_directory_match_lookups_by_path() {
    if !root() {
        return;
    }
    let fx = Fx::new();
    fx.file("upper/d/up");
    fx.file("l0/d/top");
    fx.file("l1/d/top");
    fx.file("l1/d/low");
    fx.whiteout("upper/d/low");
    fx.dir("l0/d/sub/x");
    fx.dir("l1/d/sub/y");
    fx.dir("upper/d/op");
    fx.opaque("upper/d/op");
    fx.dir("l0/d/op");
    fx.dir("l0/d/lop");
    fx.opaque("l0/d/lop");
    fx.dir("l1/d/lop");
    fx.file("l1/d/onlyl1/f");
    let s = fx.stack();
    let d = s.lookup(true, s.all_lowers(), c"./d").unwrap().unwrap();
    assert_eq!((d.upper, d.lowers), (true, 0b11));
    let at = DirFds::new(&s, d.upper, d.lowers, c"./d");
    for name in ["up", "top", "low", "sub", "op", "lop", "onlyl1", "absent"] {
        let by_path = s
            .lookup(d.upper, d.lowers, &child(c"./d", OsStr::new(name)).unwrap())
            .unwrap();
        let opened = at
            .lookup(&crate::sys::cstr(OsStr::new(name)).unwrap())
            .unwrap();
        assert_eq!(shape(opened), shape(by_path), "{name}");
    }
    let mut listed: Vec<_> = at.merged_names().unwrap();
    let mut by_path = s.merged_names(d.upper, d.lowers, c"./d").unwrap();
    listed.sort_by(|a, b| a.0.cmp(&b.0));
    by_path.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(listed, by_path);
    // A second listing through the same fds reads each layer from its start again.
    let mut again = at.merged_names().unwrap();
    again.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(again, by_path);
    // A layer where the directory is missing holds nothing.
    let sub = DirFds::new(&s, true, 0b11, c"./d/sub");
    let names: Vec<_> = sub
        .merged_names()
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
}

#[test]
fn a_stack_without_upper_or_workdir_reads_lowers_and_refuses_the_rest() {
    let fx = Fx::new();
    fx.file("l0/a");
    let l0 = fx.root.join("l0");
    let s = Stack::open_merge(None, &[&l0]).unwrap();
    assert!(!s.has_upper());
    assert!(s.lookup(false, 1, c"./a").unwrap().is_some());
    let e = s.stat(Tree::Work, c".").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EBADF));
}
