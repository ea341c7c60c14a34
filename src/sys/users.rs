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
    passwd_lookup(|pw, buf, len, out| {
        // SAFETY: valid pointers to a passwd struct, a buffer of `len` bytes and an out slot.
        unsafe { libc::getpwnam_r(c.as_ptr(), pw, buf, len, out) }
    })
}

/// The passwd entry's (uid, primary gid) of `uid` (`getpwuid_r(3)`); `None` when there is none.
///
/// Errors: as [`user_by_name`].
pub fn user_by_uid(uid: u32) -> io::Result<Option<(u32, u32)>> {
    passwd_lookup(|pw, buf, len, out| {
        // SAFETY: as in user_by_name.
        unsafe { libc::getpwuid_r(uid, pw, buf, len, out) }
    })
}

/// The largest buffer a user or group lookup grows to (bytes); the entry of a group with
/// thousands of members needs this much.
const NSS_BUF_MAX: usize = 1 << 20;

fn passwd_lookup(
    call: impl Fn(*mut libc::passwd, *mut libc::c_char, usize, *mut *mut libc::passwd) -> libc::c_int,
) -> io::Result<Option<(u32, u32)>> {
    let mut buf = vec![0 as libc::c_char; 1024];
    loop {
        let mut pw = std::mem::MaybeUninit::<libc::passwd>::uninit();
        let mut out = std::ptr::null_mut();
        let r = call(pw.as_mut_ptr(), buf.as_mut_ptr(), buf.len(), &mut out);
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
        // SAFETY: the lookup succeeded and filled `pw` (`out` points at it).
        let pw = unsafe { pw.assume_init() };
        return Ok(Some((pw.pw_uid, pw.pw_gid)));
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
    let mut buf = vec![0 as libc::c_char; 1024];
    loop {
        let mut gr = std::mem::MaybeUninit::<libc::group>::uninit();
        let mut out = std::ptr::null_mut();
        // SAFETY: valid pointers to a group struct, a buffer of its length and an out slot.
        let r = unsafe {
            libc::getgrnam_r(
                c.as_ptr(),
                gr.as_mut_ptr(),
                buf.as_mut_ptr(),
                buf.len(),
                &mut out,
            )
        };
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
        // SAFETY: the lookup succeeded and filled `gr`.
        return Ok(Some(unsafe { gr.assume_init() }.gr_gid));
    }
}
