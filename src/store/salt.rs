//! A project's key salt: 32 random bytes kept at `projects/<p>/key-salt`
//! (64 hex digits and a newline, mode 0600, in the 0700 project directory), the key of the
//! keyed digests a cache key and its recorded inputs are made of (`crate::key::KeySalt`), so a
//! digest of a weak secret cannot be tried offline without it and two projects' digests of
//! one value differ. Runners that share a remote tier must agree on it, or their keys would
//! never match: with a remote, the salt is the remote's (a fresh runner adopts it; the first
//! runner publishes its own create-only, so two fresh runners converge on one), and
//! `key-salt.remote` records which remote it was agreed with, so the remote is asked once.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::{Notice, ProjectDirs, Store};
use crate::error::{Error, IoContext, Result};
use crate::ids::ProjectId;

/// A salt's text form: 64 lowercase hex digits (and a newline when written).
pub fn salt_to_hex(salt: &[u8; 32]) -> String {
    crate::units::hex(salt)
}

/// Parses a salt's text form (64 hex digits, surrounding whitespace ignored); `None` for
/// anything else.
pub fn salt_from_hex(text: &[u8]) -> Option<[u8; 32]> {
    let t = std::str::from_utf8(text).ok()?.trim();
    if t.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(t.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

impl ProjectDirs {
    /// `projects/<p>/key-salt`.
    pub fn salt_path(&self) -> PathBuf {
        self.root.join("key-salt")
    }

    /// `projects/<p>/key-salt.remote`: the remote the salt was agreed with.
    fn salt_remote_path(&self) -> PathBuf {
        self.root.join("key-salt.remote")
    }

    /// The project's key salt if it has one (read only).
    ///
    /// Errors: [`Error::Io`] reading it; [`Error::Failed`] when it is not 64 hex digits.
    pub fn read_salt(&self) -> Result<Option<[u8; 32]>> {
        let path = self.salt_path();
        match fs::read(&path) {
            Ok(b) => salt_from_hex(&b).map(Some).ok_or_else(|| {
                Error::Failed(format!(
                    "{}: not a key salt (64 hex digits); remove it and the next run makes a new \
                     one (the project's keys then change)",
                    path.display()
                ))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(&path, e)),
        }
    }

    /// Writes `salt` as the project's key salt: created beside it 0600 and renamed into place
    /// (`replace`: over an existing one; else only where there is none, and the one found is
    /// returned instead — concurrent first runs agree).
    fn write_salt(&self, salt: &[u8; 32], replace: bool) -> Result<[u8; 32]> {
        let path = self.salt_path();
        let tmp = self
            .root
            .join(format!(".key-salt.{}", crate::sys::random_hex(6)));
        write_private(&tmp, format!("{}\n", salt_to_hex(salt)).as_bytes())?;
        let r = if replace {
            fs::rename(&tmp, &path)
        } else {
            crate::sys::rename_noreplace(&tmp, &path)
        };
        match r {
            Ok(()) => Ok(*salt),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                let _ = fs::remove_file(&tmp);
                self.read_salt()?.ok_or_else(|| Error::io(&path, e))
            }
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                Err(Error::io(&path, e))
            }
        }
    }
}

/// Creates `path` (O_EXCL, O_NOFOLLOW, mode 0600) holding `bytes`, fsynced.
fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .at(path)?;
    f.write_all(bytes).at(path)?;
    f.sync_all().at(path)
}

impl Store {
    /// The key salt of `project` (made when the project has none). Without a remote tier: the
    /// local one, or 32 fresh bytes from getrandom(2). With one: the salt agreed with it
    /// ([`super::RemoteTier::agree_salt`]: the remote's, or ours published create-only), once
    /// per remote — `key-salt.remote` names it; a remote that cannot be asked now leaves the
    /// local salt in use (asked again next time). Adopting the remote's salt in place of
    /// another local one changes the project's keys (its local layers are then reached only
    /// through the remote's keys): said in a [`Notice::Remote`].
    ///
    /// Errors: [`Error::Io`] making the project directory or writing the salt, or when
    /// getrandom(2) gives no bytes for a fresh one;
    /// [`Error::Failed`] for a local salt file that is not one.
    pub fn key_salt(&self, project: &ProjectId) -> Result<[u8; 32]> {
        let pd = self.project(project)?;
        let local = pd.read_salt()?;
        let Some(remote) = self.remote() else {
            return match local {
                Some(s) => Ok(s),
                None => pd.write_salt(&fresh_salt()?, false),
            };
        };
        let here = remote.location();
        let agreed_with = fs::read_to_string(pd.salt_remote_path()).unwrap_or_default();
        if let Some(s) = local
            && agreed_with.trim() == here
        {
            return Ok(s);
        }
        let proposed = match local {
            Some(s) => s,
            None => fresh_salt()?,
        };
        let Some(agreed) = remote.agree_salt(self, project, &proposed) else {
            return match local {
                Some(s) => Ok(s),
                None => pd.write_salt(&proposed, false),
            };
        };
        let salt = match local {
            Some(s) if s == agreed => s,
            Some(_) => {
                self.notify(Notice::Remote {
                    message: format!(
                        "project {project}: adopted the remote's key salt ({here}) in place of \
                         this store's own, so that runners agree on keys; this project's keys \
                         change once"
                    ),
                });
                pd.write_salt(&agreed, true)?
            }
            None => pd.write_salt(&agreed, false)?,
        };
        if salt == agreed {
            let marker = pd.salt_remote_path();
            let tmp = pd
                .root
                .join(format!(".key-salt.remote.{}", crate::sys::random_hex(6)));
            if write_private(&tmp, format!("{here}\n").as_bytes()).is_ok() {
                let _ = fs::rename(&tmp, &marker);
            }
        }
        Ok(salt)
    }
}

impl Store {
    /// The key salt a run keys with before it knows whether it needs the remote tier: the
    /// project's local salt when it has one, whether agreed with the remote yet or not (no
    /// round trip: a hit needs none); a project without one gets [`Store::key_salt`]'s (the
    /// remote's when it can be asked). A caller about to publish what may be pushed asks
    /// [`Store::key_salt`] and keys again if the agreed salt differs.
    ///
    /// Errors: as [`Store::key_salt`].
    pub fn local_key_salt(&self, project: &ProjectId) -> Result<[u8; 32]> {
        match self.project(project)?.read_salt()? {
            Some(s) => Ok(s),
            None => self.key_salt(project),
        }
    }
}

/// 32 bytes from getrandom(2) (the kernel's CSPRNG; no weaker fallback).
///
/// Errors: [`Error::Io`] when the kernel gives no random bytes.
fn fresh_salt() -> Result<[u8; 32]> {
    let mut salt = [0u8; 32];
    crate::sys::fill_random(&mut salt).map_err(|e| Error::io("getrandom(2)", e))?;
    Ok(salt)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn hex_round_trip_and_refusals() {
        let s = fresh_salt().unwrap();
        assert_ne!(s, [0; 32]);
        assert_eq!(salt_from_hex(salt_to_hex(&s).as_bytes()), Some(s));
        assert_eq!(salt_from_hex(b"abc"), None);
        assert_eq!(salt_from_hex(&[b'g'; 64]), None);
    }

    #[test]
    fn a_project_keeps_one_private_salt() {
        let t = tempfile::tempdir().unwrap();
        let store = Store::open(Some(t.path())).unwrap();
        let (p, q) = (ProjectId::new("p").unwrap(), ProjectId::new("q").unwrap());
        let a = store.key_salt(&p).unwrap();
        assert_eq!(store.key_salt(&p).unwrap(), a, "kept");
        assert_ne!(store.key_salt(&q).unwrap(), a, "per project");
        let path = store.project(&p).unwrap().salt_path();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // A second writer (a concurrent first run) gets the one already there.
        let pd = store.project(&p).unwrap();
        assert_eq!(pd.write_salt(&fresh_salt().unwrap(), false).unwrap(), a);
        fs::write(&path, "junk\n").unwrap();
        let e = store.key_salt(&p).unwrap_err().to_string();
        assert!(e.contains("not a key salt"), "{e}");
    }

    /// A remote tier that answers `salt` (or cannot be asked: `None`) and counts the asks.
    struct Tier {
        salt: Option<[u8; 32]>,
        asked: std::sync::atomic::AtomicUsize,
    }

    impl super::super::RemoteTier for Tier {
        fn fetch_for_mount(
            &self,
            _: &Store,
            _: &ProjectDirs,
            _: &crate::ids::CacheId,
            _: &crate::ids::CacheKey,
            _: &[crate::ids::CacheKey],
            _: bool,
        ) -> Option<super::super::Fetched> {
            None
        }
        fn finish_lazy(
            &self,
            _: &Store,
            _: &ProjectDirs,
            _: &crate::ids::CacheId,
            _: &crate::ids::CacheKey,
            _: &crate::ids::LayerId,
            _: &std::path::Path,
        ) -> Option<super::super::LazyEnd> {
            None
        }
        fn store_trace(
            &self,
            _: &ProjectDirs,
            _: &crate::ids::CacheId,
            _: &crate::ids::CacheKey,
            _: &std::path::Path,
        ) -> bool {
            false
        }
        fn push_background(
            self: std::sync::Arc<Self>,
            _: ProjectDirs,
            _: crate::ids::CacheId,
            _: crate::ids::CacheKey,
            _: crate::ids::LayerId,
        ) {
        }
        fn wait_pushes(&self, _: &Store) -> usize {
            0
        }
        fn agree_salt(&self, _: &Store, _: &ProjectId, _: &[u8; 32]) -> Option<[u8; 32]> {
            self.asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.salt
        }
        fn location(&self) -> String {
            "s3://tier".into()
        }
    }

    #[test]
    fn a_local_salt_is_keyed_with_before_the_remote_is_asked() {
        use std::sync::atomic::Ordering::SeqCst;
        let t = tempfile::tempdir().unwrap();
        let mut store = Store::open(Some(t.path())).unwrap();
        let p = ProjectId::new("p").unwrap();
        let remote_salt = fresh_salt().unwrap();
        let tier = std::sync::Arc::new(Tier {
            salt: None,
            asked: 0.into(),
        });
        store.set_remote(tier.clone());
        // A project without a salt asks (a fresh runner adopts the remote's); the remote
        // cannot be asked, so a local salt is made and no agreement recorded.
        let local = store.local_key_salt(&p).unwrap();
        assert_eq!(tier.asked.load(SeqCst), 1);
        // From then on the local salt is keyed with and the remote is not asked…
        assert_eq!(store.local_key_salt(&p).unwrap(), local);
        assert_eq!(tier.asked.load(SeqCst), 1);
        // …until agreement is needed: the remote's salt then replaces it.
        let tier = std::sync::Arc::new(Tier {
            salt: Some(remote_salt),
            asked: 0.into(),
        });
        store.set_remote(tier.clone());
        assert_eq!(store.local_key_salt(&p).unwrap(), local);
        assert_eq!(store.key_salt(&p).unwrap(), remote_salt);
        assert_eq!(store.local_key_salt(&p).unwrap(), remote_salt);
        assert_eq!(store.key_salt(&p).unwrap(), remote_salt);
        assert_eq!(tier.asked.load(SeqCst), 1, "agreed once, then recorded");
    }
}
