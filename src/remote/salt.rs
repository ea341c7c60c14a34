//! The project's key salt on the remote (`<prefix>/v1/projects/<p>/key-salt`, 64 hex digits):
//! read when there, else created from the proposed one with a conditional put
//! (`PutMode::Create`, `If-None-Match: *`), so two fresh runners converge on the first created
//! (store/salt.rs says why keys need it).

use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};

use super::Remote;
use super::error::{self, classify};
use crate::error::{Error, Result};
use crate::ids::ProjectId;
use crate::store::{ProjectDirs, salt_from_hex, salt_to_hex};

impl Remote {
    /// Before a key of `pd`'s project is pushed: the store's key salt of the project (what its
    /// keys are made with) becomes the remote's when the remote has none, created there
    /// create-only ([`Remote::agree_salt_async`]), so a fresh runner adopts it and computes
    /// the keys this store pushes. `Some(true)` when the remote's salt is (now) the store's,
    /// `Some(false)` when the remote had another, `None` when the store has no salt (its keys
    /// were made without one: nothing to agree on).
    ///
    /// Errors: as [`Remote::agree_salt_async`]; [`Error::Failed`] for a local salt file that
    /// is not one; [`Error::Io`] reading it.
    pub(super) async fn establish_salt(&self, pd: &ProjectDirs) -> Result<Option<bool>> {
        let Some(ours) = pd.read_salt()? else {
            return Ok(None);
        };
        let agreed = self.agree_salt_async(&pd.project, &ours).await?;
        Ok(Some(agreed == ours))
    }

    /// The remote's key salt of `project`, or `proposed` once created there create-only (a
    /// conflict reads the one another runner created meanwhile).
    ///
    /// Errors: [`super::RemoteError`] naming the remote; [`crate::error::Error::Failed`] for a
    /// salt object that is not 64 hex digits.
    pub(super) async fn agree_salt_async(
        &self,
        project: &ProjectId,
        proposed: &[u8; 32],
    ) -> Result<[u8; 32]> {
        let path = self.layout.salt(project);
        if let Some(s) = self.read_salt(&path).await? {
            return Ok(s);
        }
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        let body = PutPayload::from(format!("{}\n", salt_to_hex(proposed)).into_bytes());
        match self.store.put_opts(&path, body, opts).await {
            Ok(_) => Ok(*proposed),
            Err(e) if classify(&e) == error::Kind::Conflict => {
                self.read_salt(&path).await?.ok_or_else(|| {
                    Error::Failed(format!("{}: the key salt vanished after a conflict", path))
                })
            }
            Err(e) => Err(self.error("creating the project's key salt", e)),
        }
    }

    async fn read_salt(&self, path: &object_store::path::Path) -> Result<Option<[u8; 32]>> {
        let got = match self.store.get(path).await {
            Ok(g) => g,
            Err(e) if super::is_not_found(&e) => return Ok(None),
            Err(e) => return Err(self.error("reading the project's key salt", e)),
        };
        let bytes = (got.bytes().await).map_err(|e| self.error("reading the key salt", e))?;
        salt_from_hex(&bytes).map(Some).ok_or_else(|| {
            Error::Failed(format!(
                "remote {}: {path} is not a key salt (64 hex digits)",
                self.cfg.url
            ))
        })
    }
}
