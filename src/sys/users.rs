//! The user and group databases (NSS: files, LDAP, systemd-userdb…): `getpwnam_r(3)`,
//! `getpwuid_r(3)`, `getgrnam_r(3)`.

use std::ffi::CString;
use std::io;

/// The passwd entry's (uid, primary gid) of user `name` (`getpwnam_r(3)`); `None` when there is
/// none (or `name` holds a NUL).
///
/// Errors: the lookup's errno (`EIO`, `EMFILE`…: the database could not be read).
pub fn user_by_name(name: &str) -> io::Result<Option<(u32, u32)>> {
    let Ok(c) = CString::new(name) else {
        return Ok(None);
    };
    nss_lookup(
        |pw, buf, len, out| {
            // SAFETY: valid pointers to a passwd struct, a buffer of `len` bytes and an out slot.
            unsafe { libc::getpwnam_r(c.as_ptr(), pw, buf, len, out) }
        },
        ids,
    )
}

/// The passwd entry's (uid, primary gid) of `uid` (`getpwuid_r(3)`); `None` when there is none.
///
/// Errors: as [`user_by_name`].
pub fn user_by_uid(uid: u32) -> io::Result<Option<(u32, u32)>> {
    nss_lookup(
        |pw, buf, len, out| {
            // SAFETY: as in user_by_name.
            unsafe { libc::getpwuid_r(uid, pw, buf, len, out) }
        },
        ids,
    )
}

/// A passwd entry's (uid, primary gid).
fn ids(pw: &libc::passwd) -> (u32, u32) {
    (pw.pw_uid, pw.pw_gid)
}

/// The largest buffer a user or group lookup grows to (bytes); the entry of a group with
/// thousands of members needs this much.
const NSS_BUF_MAX: usize = 1 << 20;

/// One `get*_r(3)` lookup of a `T` (`libc::passwd`, `libc::group`) by `call(entry, buf, len,
/// out)`, the buffer doubled on `ERANGE` up to [`NSS_BUF_MAX`]; `pick` reads what the caller
/// needs while the buffer the entry's strings point into is alive. `None` when there is no
/// entry.
///
/// Errors: the lookup's errno.
fn nss_lookup<T, R>(
    call: impl Fn(*mut T, *mut libc::c_char, usize, *mut *mut T) -> libc::c_int,
    pick: impl FnOnce(&T) -> R,
) -> io::Result<Option<R>> {
    let mut buf = vec![0 as libc::c_char; 1024];
    loop {
        let mut entry = std::mem::MaybeUninit::<T>::uninit();
        let mut out = std::ptr::null_mut();
        let r = call(entry.as_mut_ptr(), buf.as_mut_ptr(), buf.len(), &mut out);
        if r == libc::ERANGE && buf.len() < NSS_BUF_MAX {
            buf.resize(buf.len() * 2, 0);
            continue;
        }
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
        if out.is_null() {
            return Ok(None);
        }
        // SAFETY: the lookup succeeded and filled `entry` (`out` points at it); `buf`, which
        // its pointers refer to, lives until after `pick`.
        return Ok(Some(pick(unsafe { entry.assume_init_ref() })));
    }
}

/// The gid of group `name` (`getgrnam_r(3)`); `None` when there is none (or `name` holds a
/// NUL).
///
/// Errors: as [`user_by_name`].
pub fn group_by_name(name: &str) -> io::Result<Option<u32>> {
    let Ok(c) = CString::new(name) else {
        return Ok(None);
    };
    nss_lookup(
        |gr, buf, len, out| {
            // SAFETY: valid pointers to a group struct, a buffer of `len` bytes and an out slot.
            unsafe { libc::getgrnam_r(c.as_ptr(), gr, buf, len, out) }
        },
        |gr: &libc::group| gr.gr_gid,
    )
}
