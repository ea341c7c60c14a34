//! `layercache overlay -o squash_to_uid=U,squash_to_gid=G` (issue 12, fuse-overlayfs's names):
//! every entry is reported as owned by U:G, so that user creates, changes and deletes files a
//! root-owned lower holds with no chmod; the upper keeps the canonical owner 0:0; modes are
//! still enforced by the kernel (`default_permissions`). Real FUSE mounts as root; the
//! [`Fixture`] unmounts even on panic.

#[macro_use]
mod common;

use std::os::unix::fs::MetadataExt;
use std::process::Command;

use common::*;

fn as_user(uid: u32, dir: &std::path::Path, script: &str) -> std::process::Output {
    Command::new("setpriv")
        .args([
            &format!("--reuid={uid}"),
            &format!("--regid={uid}"),
            "--clear-groups",
            "sh",
            "-c",
            script,
        ])
        .current_dir(dir)
        .output()
        .expect("setpriv")
}

#[test]
fn squash_to_uid_lets_that_user_change_a_root_owned_lower_and_stores_root_owners() {
    require_root!();
    if Impl::current() != Impl::Layercache {
        return;
    }
    let mut fx = Fixture::builder().unmounted().build(|l| {
        write(&l[0].join("d/f"), "lower\n");
        write(&l[0].join("d/g"), "keep\n");
        chmod(&l[0].join("d/g"), 0o600);
    });
    fx.mount_with(|c| {
        c.args(["-o", "squash_to_uid=1000,squash_to_gid=1000"]);
    });
    let meta = std::fs::metadata(fx.p("d/f")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (1000, 1000));
    let o = as_user(
        1000,
        &fx.mnt,
        "echo new > d/new && echo more >> d/f && mkdir d/sub && echo x > d/sub/y && \
         rm d/g && cat d/f",
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "lower\nmore\n");
    for rel in ["d/new", "d/f", "d/sub", "d/sub/y"] {
        let m = std::fs::metadata(fx.upper.join(rel)).unwrap();
        assert_eq!((m.uid(), m.gid()), (0, 0), "{rel} in the upper");
        let m = std::fs::metadata(fx.p(rel)).unwrap();
        assert_eq!((m.uid(), m.gid()), (1000, 1000), "{rel} in the view");
    }
    assert!(is_whiteout(&fx.upper.join("d/g")));
    // Modes still hold: another user cannot write a 0644 file of the mapped owner.
    let o = as_user(1001, &fx.mnt, "echo no >> d/new");
    assert!(!o.status.success(), "uid 1001 wrote a 0644 file of 1000");
}

#[test]
fn squash_options_name_a_bad_value() {
    let o = Command::new(BIN)
        .args([
            "overlay",
            "-o",
            "lowerdir=/x,upperdir=/y,squash_to_uid=me",
            "/z",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("squash_to_uid"));
}
