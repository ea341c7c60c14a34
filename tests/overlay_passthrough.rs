//! FUSE passthrough mode (`LAYERCACHE_PASSTHROUGH=1`, issue 15): sequences of opens, writes
//! and copy-ups that must never fail with EIO (the kernel's one-I/O-mode-per-inode rule makes
//! a wrong OPEN answer an EIO), and the documented limit: an open for writing while readers
//! of the lower file are open through passthrough fails with ETXTBSY.

#[macro_use]
mod common;

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;

use common::*;

fn fixture() -> Fixture {
    let mut fx = Fixture::builder().unmounted().build(|l| {
        write(&l[0].join("f"), "lower content\n");
        write(&l[0].join("g"), "g lower\n");
    });
    fx.mount_with(|c| {
        c.env("LAYERCACHE_PASSTHROUGH", "1");
    });
    fx
}

fn contents(f: &File) -> String {
    let mut buf = vec![0u8; 64];
    let n = f.read_at(&mut buf, 0).unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn opens_writes_and_copy_ups_in_sequence_never_fail() {
    require_root!();
    only_layercache!("LAYERCACHE_PASSTHROUGH is layercache's");
    let fx = fixture();
    // Read a lower file, close it, then write it (copy-up at open) and read it again while
    // the writer is open: every open of the copy shares its backing file.
    assert_eq!(read(&fx.p("f")), "lower content\n");
    let w = OpenOptions::new().write(true).open(fx.p("f")).unwrap();
    w.write_at(b"UPPER", 0).unwrap();
    let r = File::open(fx.p("f")).unwrap();
    assert_eq!(contents(&r), "UPPER content\n");
    w.set_len(5).unwrap();
    assert_eq!(contents(&r), "UPPER");
    drop((w, r));
    assert_eq!(read(&fx.upper.join("f")), "UPPER");
    // A created file: written and read back through two opens at once.
    let mut c = File::create(fx.p("new")).unwrap();
    c.write_all(b"created").unwrap();
    let r = File::open(fx.p("new")).unwrap();
    assert_eq!(contents(&r), "created");
    drop((c, r));
    // A metadata copy-up (chmod) while a reader is open: new readers still work.
    let early = File::open(fx.p("g")).unwrap();
    chmod(&fx.p("g"), 0o600);
    let late = File::open(fx.p("g")).unwrap();
    assert_eq!(contents(&early), "g lower\n");
    assert_eq!(contents(&late), "g lower\n");
    drop((early, late));
    // Once the readers are gone the copy can be written.
    fs::write(fx.p("g"), "g upper\n").unwrap();
    let mut s = String::new();
    File::open(fx.p("g"))
        .unwrap()
        .read_to_string(&mut s)
        .unwrap();
    assert_eq!(s, "g upper\n");
}

#[test]
fn a_writer_while_lower_readers_are_open_gets_etxtbsy_not_eio() {
    require_root!();
    only_layercache!("LAYERCACHE_PASSTHROUGH is layercache's");
    let fx = fixture();
    let reader = File::open(fx.p("f")).unwrap();
    let err = OpenOptions::new()
        .write(true)
        .open(fx.p("f"))
        .expect_err("a writer while a passthrough reader of the lower file is open");
    assert_eq!(err.raw_os_error(), Some(libc::ETXTBSY), "{err}");
    assert_eq!(contents(&reader), "lower content\n");
    drop(reader);
    let w = OpenOptions::new().write(true).open(fx.p("f")).unwrap();
    w.write_at(b"later", 0).unwrap();
    drop(w);
    assert_eq!(read(&fx.p("f")), "later content\n");
    fx.assert_lower_unchanged();
}
