//! `--user` (and the spec's `user`) for every driver: its syntax ([`check_syntax`]);
//! for `--sandbox none` and `--sandbox bwrap`, the user setup, maintenance and COMMAND run as,
//! resolved on the host ([`RunUser::resolve`]), and the drop to it in the child before exec.
//!
//! Forms (docker-run(1)'s): `UID:GID` (taken as given, like docker: the ids need no passwd
//! entry), `UID` (its primary group from the passwd database), `NAME` (uid and primary group
//! from the passwd database), `NAME:GROUP` / `UID:GROUP` / `NAME:GID` (the group from the group
//! database). Names are resolved with getpwnam_r(3)/getgrnam_r(3) (libc), so NSS sources count.
//! Ids are 0 to [`MAX_ID`]: 4294967295 is `(uid_t)-1`, "unchanged" to setresuid(2), refused.
//!
//! The drop follows the order privilege-separation code uses (e.g. OpenSSH's
//! `permanently_set_uid`): setgroups(2) to no supplementary groups, setgid(2), setuid(2).

use std::ops::Not;
use std::process::Command;

use crate::error::{Error, Result};
use crate::sys;

/// Where a user value came from, so its errors name it: the `--user` flag or the spec's
/// `user` field. Displays as `--user` / `the spec's user`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum UserSource {
    /// `--user USER` on the command line.
    #[default]
    Flag,
    /// `user = "…"` at the top of the spec.
    Spec,
}

impl std::fmt::Display for UserSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            UserSource::Flag => "--user",
            UserSource::Spec => "the spec's user",
        })
    }
}

/// The largest uid or gid a user may be given: 4294967295 is `(uid_t)-1`, which setresuid(2)
/// and setresgid(2) take as "leave this id unchanged" (the child would stay root).
pub const MAX_ID: u32 = u32::MAX - 1;

/// What is wrong with the syntax of `user` (`UID`, `UID:GID`, `NAME` or `NAME:GROUP`,
/// docker-run(1)'s forms), as `"VALUE": what would be valid`; `None` when it is well formed.
/// A part of digits only is an id and must be at most [`MAX_ID`].
pub fn syntax_problem(user: &str) -> Option<String> {
    let ok_part = |p: &str| {
        !p.is_empty()
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
    };
    let mut parts = user.splitn(2, ':');
    let u = parts.next().unwrap_or_default();
    let g = parts.next();
    if !(ok_part(u) && g.is_none_or(ok_part)) {
        return Some(format!("{user:?}: use UID, UID:GID, NAME or NAME:GROUP"));
    }
    let out_of_range = |p: &str| {
        p.bytes().all(|b| b.is_ascii_digit()) && p.parse::<u32>().is_ok_and(|n| n <= MAX_ID).not()
    };
    [("uid", Some(u)), ("gid", g)]
        .into_iter()
        .find_map(|(what, p)| p.filter(|p| out_of_range(p)).map(|p| (what, p)))
        .map(|(what, p)| {
            format!(
                "{user:?}: {what} {p} is out of range: an id is 0 to {MAX_ID} ({} is -1, which \
                 setresuid(2)/setresgid(2) take as \"unchanged\")",
                u32::MAX
            )
        })
}

/// Checks the syntax of `user` (see [`syntax_problem`]) given as `source`.
///
/// Errors: [`Error::Invalid`] naming the source (`--user "…"` or `the spec's user "…"`) for an
/// empty part or characters no user name has.
pub fn check_syntax(user: &str, source: UserSource) -> Result<()> {
    match syntax_problem(user) {
        Some(p) => Err(Error::invalid(format!("{source} {p}"))),
        None => Ok(()),
    }
}

/// A resolved `--user`: the ids the children run as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunUser {
    /// Real, effective and saved user id.
    pub uid: u32,
    /// Real, effective and saved group id (and no supplementary groups).
    pub gid: u32,
}

impl RunUser {
    /// Resolves `input` (see the module docs), given as `source`, against this host's user
    /// and group databases.
    ///
    /// Errors: [`Error::Invalid`] (exit 2) naming the input as its source gave it (`--user
    /// INPUT` or `the spec's user INPUT`): bad syntax, a user name or a bare UID with no passwd
    /// entry, a group name with no group entry, or a lookup error.
    pub fn resolve(input: &str, source: UserSource) -> Result<RunUser> {
        check_syntax(input, source)?;
        let bad = |what: String| Error::invalid(format!("{source} {input}: {what}"));
        let lookup = |e: std::io::Error| bad(format!("looking it up failed: {e}"));
        let (u, g) = match input.split_once(':') {
            Some((u, g)) => (u, Some(g)),
            None => (input, None),
        };
        let (uid, primary) = match u.parse::<u32>() {
            Ok(uid) if g.is_some_and(|g| g.parse::<u32>().is_ok()) => (uid, None),
            Ok(uid) => match sys::user_by_uid(uid).map_err(lookup)? {
                Some((_, gid)) => (uid, Some(gid)),
                None if g.is_some() => (uid, None),
                None => {
                    return Err(bad(format!(
                        "no user with uid {uid} in the passwd database (give UID:GID)"
                    )));
                }
            },
            Err(_) => match sys::user_by_name(u).map_err(lookup)? {
                Some((uid, gid)) => (uid, Some(gid)),
                None => {
                    return Err(bad(format!(
                        "no such user {u:?} in the passwd database (use UID:GID or an existing \
                         user name)"
                    )));
                }
            },
        };
        let gid = match g {
            None => primary.unwrap_or_default(),
            Some(g) => match g.parse::<u32>() {
                Ok(gid) => gid,
                Err(_) => match sys::group_by_name(g).map_err(lookup)? {
                    Some(gid) => gid,
                    None => {
                        return Err(bad(format!(
                            "no such group {g:?} in the group database (use a GID or an \
                             existing group name)"
                        )));
                    }
                },
            },
        };
        Ok(RunUser { uid, gid })
    }

    /// Makes `cmd` drop to this user just before it execs, after the hooks registered before
    /// this one (the views of [`crate::run::Views::apply`] need root): setgroups([]), setgid,
    /// setuid. Register it before anything that credential changes reset (PR_SET_PDEATHSIG).
    ///
    /// The spawn fails with the errno of the first call that fails (EPERM when layercache is
    /// not root).
    pub fn drop_privileges(&self, cmd: &mut Command) {
        let (uid, gid) = (self.uid, self.gid);
        // SAFETY: between fork and exec only `sys::forked::drop_to` runs: setgroups(2),
        // setresgid(2) and setresuid(2), async-signal-safe raw system calls (so glibc's
        // all-threads credential broadcast is not involved: the forked child has one thread).
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(cmd, move || {
                crate::sys::forked::drop_to(uid, gid)
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_syntax() {
        for ok in ["1000", "1000:1000", "user1000", "user1000:user1000"] {
            check_syntax(ok, UserSource::Flag).unwrap();
        }
        for bad in ["", ":", "1000:", "a b", "x;y"] {
            let flag = check_syntax(bad, UserSource::Flag).unwrap_err();
            assert!(flag.to_string().starts_with("--user "), "{flag}");
            let spec = check_syntax(bad, UserSource::Spec).unwrap_err();
            assert!(spec.to_string().starts_with("the spec's user "), "{spec}");
        }
    }

    #[test]
    fn ids_above_4294967294_are_refused_naming_the_source() {
        for bad in [
            "4294967295",
            "4294967295:0",
            "0:4294967295",
            "99999999999",
            "1:4294967296",
        ] {
            let e = RunUser::resolve(bad, UserSource::Flag)
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with(&format!("--user {bad:?}: ")) && e.contains("0 to 4294967294"),
                "{e}"
            );
            assert_eq!(e.lines().count(), 1, "{e}");
            let e = check_syntax(bad, UserSource::Spec).unwrap_err().to_string();
            assert!(e.starts_with("the spec's user "), "{e}");
        }
        let u = RunUser::resolve("4294967294:4294967294", UserSource::Flag).unwrap();
        assert_eq!((u.uid, u.gid), (MAX_ID, MAX_ID));
    }

    #[test]
    fn numeric_pairs_need_no_passwd_entry() {
        let u = RunUser::resolve("4242:4343", UserSource::Flag).unwrap();
        assert_eq!((u.uid, u.gid), (4242, 4343));
    }

    #[test]
    fn names_and_bare_uids_resolve_from_passwd() {
        // root is in every passwd database.
        assert_eq!(
            RunUser::resolve("root", UserSource::Flag).unwrap(),
            RunUser { uid: 0, gid: 0 }
        );
        let zero = RunUser { uid: 0, gid: 0 };
        assert_eq!(RunUser::resolve("0", UserSource::Spec).unwrap(), zero);
        assert_eq!(RunUser::resolve("root:0", UserSource::Flag).unwrap().gid, 0);
    }

    #[test]
    fn unknown_users_and_groups_name_the_input() {
        for bad in [
            "no-such-user-lc",
            "no-such-user-lc:0",
            "0:no-such-group-lc",
            "4242424",
            "a b",
        ] {
            let e = RunUser::resolve(bad, UserSource::Flag).unwrap_err();
            assert!(e.to_string().contains(&format!("--user {bad}")) || bad == "a b");
            assert_eq!(e.exit_code(), 2, "{e}");
            let e = RunUser::resolve(bad, UserSource::Spec).unwrap_err();
            assert!(e.to_string().starts_with("the spec's user "), "{e}");
        }
    }
}
