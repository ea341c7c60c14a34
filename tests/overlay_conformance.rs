//! Behaviour xfstests checks that kernel overlayfs has and layercache lacked (issue 25): each
//! test reproduces one generic/NNN failure with a direct syscall check, so the suite catches a
//! regression without xfstests. `LAYERCACHE_TEST_IMPL=kernel` runs them against kernel
//! overlayfs to prove the tests right.

#[macro_use]
mod common;

use std::ffi::CString;
use std::path::Path;
use std::process::Command;

use common::*;

/// `getxattr(p, name, NULL, 0)`: the size the value needs, or the errno.
fn xattr_size(p: &Path, name: &str) -> Result<usize, i32> {
    let c = cstr(p);
    let n = CString::new(name).unwrap();
    // SAFETY: valid C strings; a null buffer with size 0 asks for the value's size.
    let r = unsafe { libc::lgetxattr(c.as_ptr(), n.as_ptr(), std::ptr::null_mut(), 0) };
    if r < 0 { Err(errno()) } else { Ok(r as usize) }
}

/// `listxattr(p, NULL, 0)` (the size the name list needs) and the length of the list read
/// into a large buffer.
fn xattr_list_sizes(p: &Path) -> (usize, usize) {
    let c = cstr(p);
    // SAFETY: valid C string; a null buffer with size 0 asks for the list's size.
    let asked = unsafe { libc::llistxattr(c.as_ptr(), std::ptr::null_mut(), 0) };
    assert!(asked >= 0, "llistxattr {}: errno {}", p.display(), errno());
    let mut buf = vec![0u8; 65536];
    // SAFETY: buf is writable for its length.
    let got = unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(got >= 0, "llistxattr {}: errno {}", p.display(), errno());
    (asked as usize, got as usize)
}

/// generic/020, 037, 062, 097, 337, 523, 533, 618 (`getfattr -d` printed `user.fish=""`) and
/// 633, 688 (security.capability lost): the size query `getxattr(name, NULL, 0)` — what
/// getfattr, `cp -a`, `tar --xattrs`, `rsync -X` and the kernel's own capability read make
/// first — answers the value's length, for a lower file, a copied-up one and a new one; and
/// `listxattr(NULL, 0)` answers the name list's length.
#[test]
fn size_only_getxattr_and_listxattr_answer_the_length() {
    require_root!();
    let fx = Fixture::new(|l| {
        write(&l.join("lower"), "l");
        set_xattr(&l.join("lower"), "user.fish", b"fishval").unwrap();
        write(&l.join("copied"), "c");
        set_xattr(&l.join("copied"), "user.fish", b"fishval").unwrap();
    });
    write(&fx.p("new"), "n");
    set_xattr(&fx.p("new"), "user.fish", b"fishval").unwrap();
    set_xattr(&fx.p("copied"), "user.other", b"12345678901").unwrap();
    for name in ["lower", "copied", "new"] {
        let p = fx.p(name);
        assert_eq!(
            xattr_size(&p, "user.fish"),
            Ok(7),
            "{name}: size of user.fish"
        );
        assert_eq!(
            xattr_size(&p, "user.absent"),
            Err(libc::ENODATA),
            "{name}: size of an absent name"
        );
    }
    assert_eq!(xattr_size(&fx.p("copied"), "user.other"), Ok(11));
    for name in ["lower", "copied", "new"] {
        let (asked, got) = xattr_list_sizes(&fx.p(name));
        // At least "user.fish\0" (10 bytes). The size query may over-estimate (kernel
        // overlayfs counts the names it hides) but never under-estimate.
        assert!(got >= 10, "{name}: listxattr gave {got} bytes");
        assert!(
            asked >= got,
            "{name}: size query of listxattr {asked} < {got}"
        );
    }
    // The kernel reads security.capability with a size query first (vfs_getxattr_alloc);
    // a 0 there made every read of a file capability fail with EINVAL (generic/633, 688).
    let cap = fx.p("new");
    let st = Command::new("setcap")
        .args(["cap_net_raw+ep"])
        .arg(&cap)
        .output();
    let Ok(out) = st else {
        eprintln!("setcap not installed: capability part skipped");
        return;
    };
    assert!(
        out.status.success(),
        "setcap: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = Command::new("getcap").arg(&cap).output().unwrap();
    let text = String::from_utf8_lossy(&got.stdout);
    assert!(
        text.contains("cap_net_raw"),
        "getcap after setcap: {text:?} (stderr {:?})",
        String::from_utf8_lossy(&got.stderr)
    );
}
