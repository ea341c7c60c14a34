//! Rename semantics: files, over lower files, onto deleted names, and directories that exist in
//! the lower layer (populated ones too) — no EXDEV (issue 2).
//!
//! Kernel overlayfs returns EXDEV for renames of lower/merged directories unless mounted with
//! `redirect_dir=on`; the directory tests mount it that way so they still prove themselves
//! against the kernel (the option has no effect on the other implementations).

#[macro_use]
mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::*;

fn dir_fixture(populate: impl FnOnce(&Path)) -> Fixture {
    Fixture::builder()
        .kernel_opt("redirect_dir=on")
        .build(|l| populate(&l[0]))
}

#[test]
fn rename_files_upper_and_lower() {
    require_root!();
    let mut fx = Fixture::new(|l| {
        write(&l.join("low"), "low");
        write(&l.join("d/inner"), "inner");
    });
    write(&fx.p("up"), "up");
    fs::rename(fx.p("up"), fx.p("up2")).unwrap();
    fs::rename(fx.p("low"), fx.p("low2")).unwrap();
    fs::rename(fx.p("d/inner"), fx.p("moved")).unwrap();
    for _ in 0..2 {
        assert_eq!(names(&fx.mnt), ["d", "low2", "moved", "up2"]);
        assert_eq!(names(&fx.p("d")), Vec::<String>::new());
        assert_eq!(read(&fx.p("up2")), "up");
        assert_eq!(read(&fx.p("low2")), "low");
        assert_eq!(read(&fx.p("moved")), "inner");
        for gone in ["up", "low", "d/inner"] {
            assert_enoent(&fx.p(gone));
        }
        fx.remount();
    }
}

#[test]
fn rename_over_existing_lower_file() {
    require_root!();
    let mut fx = Fixture::new(|l| {
        write(&l.join("target"), "old lower");
        write(&l.join("target2"), "old lower 2");
        write(&l.join("src_low"), "from lower");
    });
    write(&fx.p("src_up"), "from upper");
    let ino = fs::metadata(fx.p("src_up")).unwrap().ino();
    fs::rename(fx.p("src_up"), fx.p("target")).unwrap();
    fs::rename(fx.p("src_low"), fx.p("target2")).unwrap();
    assert_eq!(
        fs::metadata(fx.p("target")).unwrap().ino(),
        ino,
        "renamed inode keeps st_ino"
    );
    for _ in 0..2 {
        assert_eq!(names(&fx.mnt), ["target", "target2"]);
        assert_eq!(read(&fx.p("target")), "from upper");
        assert_eq!(read(&fx.p("target2")), "from lower");
        fx.remount();
    }
}

#[test]
fn rename_noreplace_over_lower_file_is_eexist() {
    require_root!();
    let fx = Fixture::new(|l| write(&l.join("target"), "lower"));
    write(&fx.p("src"), "src");
    let (a, b) = (cstr(&fx.p("src")), cstr(&fx.p("target")));
    // SAFETY: valid C strings.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    assert_eq!((r, errno()), (-1, libc::EEXIST));
    assert_eq!(read(&fx.p("target")), "lower");
    assert_eq!(read(&fx.p("src")), "src");
}

#[test]
fn rename_onto_deleted_lower_name() {
    require_root!();
    let mut fx = Fixture::new(|l| {
        write(&l.join("x"), "lower x");
        write(&l.join("y"), "lower y");
        write(&l.join("gone"), "lower gone");
    });
    // Delete the lower x, then rename y onto the freed name.
    fs::remove_file(fx.p("x")).unwrap();
    fs::rename(fx.p("y"), fx.p("x")).unwrap();
    // Delete lower `gone`, put an upper file there by rename, then delete that too.
    fs::remove_file(fx.p("gone")).unwrap();
    write(&fx.p("tmp"), "tmp");
    fs::rename(fx.p("tmp"), fx.p("gone")).unwrap();
    assert_eq!(read(&fx.p("gone")), "tmp");
    fs::remove_file(fx.p("gone")).unwrap();
    for round in 0..2 {
        assert_eq!(read(&fx.p("x")), "lower y", "round {round}");
        assert_enoent(&fx.p("y"));
        assert_enoent(&fx.p("gone"));
        assert_eq!(names(&fx.mnt), ["x"], "round {round}");
        fx.remount();
    }
    // And after a remount the freed names can be used once more.
    write(&fx.p("tmp"), "again");
    fs::rename(fx.p("tmp"), fx.p("gone")).unwrap();
    fs::rename(fx.p("x"), fx.p("y")).unwrap();
    fx.remount();
    assert_eq!(names(&fx.mnt), ["gone", "y"]);
    assert_eq!(read(&fx.p("gone")), "again");
    assert_eq!(read(&fx.p("y")), "lower y");
}

#[test]
fn rename_populated_lower_directory() {
    require_root!();
    let mut fx = dir_fixture(|l| {
        write(&l.join("d/a"), "a");
        write(&l.join("d/b"), "b");
        write(&l.join("d/edited"), "before");
        write(&l.join("d/deleted"), "deleted");
        write(&l.join("d/sub/deep/c"), "c");
        std::os::unix::fs::symlink("a", l.join("d/link")).unwrap();
        write(&l.join("e_sibling"), "s");
    });
    let ino_d = fs::metadata(fx.p("d")).unwrap().ino();
    write(&fx.p("d/edited"), "after");
    fs::remove_file(fx.p("d/deleted")).unwrap();
    write(&fx.p("d/new"), "new");
    fs::rename(fx.p("d"), fx.p("e")).unwrap();
    assert_eq!(
        fs::metadata(fx.p("e")).unwrap().ino(),
        ino_d,
        "renamed dir keeps st_ino"
    );
    let check = |fx: &Fixture| {
        assert_enoent(&fx.p("d"));
        assert_eq!(names(&fx.mnt), ["e", "e_sibling"]);
        assert_eq!(
            names(&fx.p("e")),
            ["a", "b", "edited", "link", "new", "sub"]
        );
        assert_eq!(read(&fx.p("e/a")), "a");
        assert_eq!(read(&fx.p("e/b")), "b");
        assert_eq!(read(&fx.p("e/edited")), "after");
        assert_eq!(read(&fx.p("e/new")), "new");
        assert_eq!(read(&fx.p("e/sub/deep/c")), "c");
        assert_eq!(read(&fx.p("e/link")), "a");
        assert_enoent(&fx.p("e/deleted"));
    };
    check(&fx);
    fx.remount();
    check(&fx);
    // The renamed directory keeps working: edit an untouched child, add and remove entries.
    write(&fx.p("e/b"), "b2");
    fs::remove_file(fx.p("e/a")).unwrap();
    fx.remount();
    assert_eq!(names(&fx.p("e")), ["b", "edited", "link", "new", "sub"]);
    assert_eq!(read(&fx.p("e/b")), "b2");
}

#[test]
fn rename_lower_directory_then_recreate_old_name() {
    require_root!();
    let mut fx = dir_fixture(|l| {
        write(&l.join("d/a"), "a");
        write(&l.join("d/sub/b"), "b");
    });
    fs::rename(fx.p("d"), fx.p("e")).unwrap();
    fs::create_dir(fx.p("d")).unwrap();
    write(&fx.p("d/fresh"), "fresh");
    for _ in 0..2 {
        assert_eq!(
            names(&fx.p("d")),
            ["fresh"],
            "old lower children must not leak"
        );
        assert_enoent(&fx.p("d/a"));
        assert_enoent(&fx.p("d/sub"));
        assert_eq!(names(&fx.p("e")), ["a", "sub"]);
        assert_eq!(read(&fx.p("e/sub/b")), "b");
        fx.remount();
    }
}

#[test]
fn files_read_before_their_lower_directories_are_swapped_read_right_after() {
    require_root!();
    let fx = dir_fixture(|l| {
        write(&l.join("x/deep/f"), "x");
        write(&l.join("x/deep/g"), "xg");
        write(&l.join("y/deep/f"), "y");
        write(&l.join("y/deep/g"), "yg");
    });
    // First reads open each lower file relative to its directory, whose fd the daemon keeps;
    // the swap must not leave a later read looking in the wrong directory.
    assert_eq!(read(&fx.p("x/deep/f")), "x");
    assert_eq!(read(&fx.p("y/deep/f")), "y");
    fs::rename(fx.p("x"), fx.p("tmp")).unwrap();
    fs::rename(fx.p("y"), fx.p("x")).unwrap();
    fs::rename(fx.p("tmp"), fx.p("y")).unwrap();
    assert_eq!(read(&fx.p("x/deep/f")), "y");
    assert_eq!(read(&fx.p("x/deep/g")), "yg");
    assert_eq!(read(&fx.p("y/deep/f")), "x");
    assert_eq!(read(&fx.p("y/deep/g")), "xg");
}

#[test]
fn rename_lower_directory_into_another_directory_and_back() {
    require_root!();
    let mut fx = dir_fixture(|l| {
        write(&l.join("pkg/index.js"), "js");
        write(&l.join("pkg/lib/util.js"), "util");
        fs::create_dir(l.join("node_modules")).unwrap();
    });
    // The npm pattern: move into place under a temp name, then to the final name.
    fs::rename(fx.p("pkg"), fx.p("node_modules/.pkg-tmp")).unwrap();
    fs::rename(fx.p("node_modules/.pkg-tmp"), fx.p("node_modules/pkg")).unwrap();
    fx.remount();
    assert_eq!(names(&fx.mnt), ["node_modules"]);
    assert_eq!(names(&fx.p("node_modules")), ["pkg"]);
    assert_eq!(read(&fx.p("node_modules/pkg/lib/util.js")), "util");
    fs::rename(fx.p("node_modules/pkg"), fx.p("pkg")).unwrap();
    fx.remount();
    assert_eq!(names(&fx.mnt), ["node_modules", "pkg"]);
    assert_eq!(names(&fx.p("pkg")), ["index.js", "lib"]);
    assert_eq!(names(&fx.p("node_modules")), Vec::<String>::new());
    assert_eq!(read(&fx.p("pkg/index.js")), "js");
}

#[test]
fn rename_directory_over_empty_and_nonempty_directories() {
    require_root!();
    let mut fx = dir_fixture(|l| {
        write(&l.join("src/f"), "f");
        fs::create_dir(l.join("empty")).unwrap();
        write(&l.join("emptied/old"), "old");
        write(&l.join("full/x"), "x");
    });
    let full = fs::rename(fx.p("src"), fx.p("full")).unwrap_err();
    assert!(
        matches!(
            full.raw_os_error(),
            Some(libc::ENOTEMPTY) | Some(libc::EEXIST)
        ),
        "rename over a non-empty dir: {full}"
    );
    fs::rename(fx.p("src"), fx.p("empty")).unwrap();
    // A lower dir whose children were all deleted is empty in the merged view.
    fs::remove_file(fx.p("emptied/old")).unwrap();
    fs::rename(fx.p("empty"), fx.p("emptied")).unwrap();
    for _ in 0..2 {
        assert_eq!(names(&fx.mnt), ["emptied", "full"]);
        assert_eq!(
            names(&fx.p("emptied")),
            ["f"],
            "no lower child of the target leaks"
        );
        assert_eq!(read(&fx.p("emptied/f")), "f");
        fx.remount();
    }
}

#[test]
fn rename_upper_directory() {
    require_root!();
    let mut fx = Fixture::new(|l| fs::create_dir(l.join("parent")).unwrap());
    write(&fx.p("parent/newdir/a"), "a");
    write(&fx.p("parent/newdir/sub/b"), "b");
    fs::rename(fx.p("parent/newdir"), fx.p("moved")).unwrap();
    fx.remount();
    assert_eq!(names(&fx.p("moved")), ["a", "sub"]);
    assert_eq!(read(&fx.p("moved/sub/b")), "b");
    assert_eq!(names(&fx.p("parent")), Vec::<String>::new());
}
