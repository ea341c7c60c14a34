//! Packs: small objects uploaded back to back in one remote object (`packs/<pack>.pack`, named
//! by the blake3 of its bytes) with an index (`packs/<pack>.idx`, written after the pack), so a
//! layer of many small files costs a few requests each way (restic/kopia/git packfiles). A pull
//! fetches only the byte ranges of the objects it lacks (object_store coalesces near ranges)
//! and verifies each object's blake3 on arrival.

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use futures::{StreamExt, TryStreamExt};
use object_store::{ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};

use super::Remote;
use crate::error::{Error, IoContext, Result};
use crate::ids::{ObjectId, ProjectId};

/// Where a packed object is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    /// Pack id (blake3 hex of the pack's bytes).
    pub pack: String,
    /// Byte offset in the pack.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

/// `packs/<pack>.idx`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PackIndex {
    /// `(object hex, offset, length)` in pack order.
    pub objects: Vec<(String, u64, u64)>,
}

/// Packs downloading at once (each holds up to a pack's worth of ranges in memory).
const PACK_PARALLEL: usize = 8;

impl Remote {
    /// Where every packed object of `project` is, from the index of every pack (a pack counts
    /// only once its bytes and its index are both there: the index is written after the pack).
    ///
    /// Errors: [`Error::Failed`] naming the remote.
    pub async fn pack_locations(&self, project: &ProjectId) -> Result<HashMap<ObjectId, Location>> {
        let listed = self.list_dir(&self.layout.packs(project)).await?;
        let names: std::collections::HashSet<String> = listed
            .iter()
            .filter_map(|m| m.location.filename().map(str::to_string))
            .collect();
        let packs: Vec<String> = names
            .iter()
            .filter_map(|n| n.strip_suffix(".idx"))
            .filter(|p| names.contains(&format!("{p}.pack")))
            .map(str::to_string)
            .collect();
        let indexes = futures::stream::iter(packs.into_iter().map(|pack| async move {
            let path = self.layout.pack_index(project, &pack);
            let bytes = self
                .store
                .get(&path)
                .await
                .map_err(|e| self.error("reading a pack index", e))?
                .bytes()
                .await
                .map_err(|e| self.error("reading a pack index", e))?;
            let idx: PackIndex = serde_json::from_slice(&bytes).map_err(|e| {
                Error::Failed(format!(
                    "remote {}: {path}: corrupt pack index: {e}",
                    self.cfg.url
                ))
            })?;
            Ok::<_, Error>((pack, idx))
        }))
        .buffer_unordered(self.cfg.concurrency)
        .try_collect::<Vec<_>>()
        .await?;
        let mut out = HashMap::new();
        for (pack, idx) in indexes {
            for (hex, offset, len) in idx.objects {
                if let Ok(id) = ObjectId::from_hex(&hex) {
                    let loc = Location {
                        pack: pack.clone(),
                        offset,
                        len,
                    };
                    out.entry(id).or_insert(loc);
                }
            }
        }
        Ok(out)
    }

    /// Uploads `objects` (id, local file, size; in the order given) in packs of about
    /// `pack_size`, each pack before its index; returns where each object now is. Every file is
    /// checked to still hash to its id while it is read (a damaged local file is never sent).
    ///
    /// Errors: [`Error::Io`] reading a file, [`Error::Failed`] for a mismatch or remote error.
    pub async fn upload_packs(
        &self,
        project: &ProjectId,
        objects: &[(ObjectId, PathBuf, u64)],
    ) -> Result<HashMap<ObjectId, Location>> {
        let mut groups: Vec<&[(ObjectId, PathBuf, u64)]> = Vec::new();
        let (mut start, mut bytes) = (0, 0u64);
        for (i, o) in objects.iter().enumerate() {
            if bytes > 0 && bytes + o.2 > self.cfg.pack_size {
                groups.push(&objects[start..i]);
                (start, bytes) = (i, 0);
            }
            bytes += o.2;
        }
        if start < objects.len() {
            groups.push(&objects[start..]);
        }
        let placed =
            futures::stream::iter(groups.into_iter().map(|g| self.upload_pack(project, g)))
                .buffer_unordered(PACK_PARALLEL.min(self.cfg.concurrency))
                .try_collect::<Vec<_>>()
                .await?;
        Ok(placed.into_iter().flatten().collect())
    }

    async fn upload_pack(
        &self,
        project: &ProjectId,
        group: &[(ObjectId, PathBuf, u64)],
    ) -> Result<Vec<(ObjectId, Location)>> {
        let mut buf = Vec::with_capacity(group.iter().map(|g| g.2 as usize).sum());
        let mut index = PackIndex::default();
        for (id, path, _) in group {
            let bytes = fs::read(path).at(path)?;
            if blake3::hash(&bytes).as_bytes() != &id.0 {
                return Err(Error::Failed(format!(
                    "{}: its bytes no longer hash to object {id}; not pushed (run `layercache \
                     verify`)",
                    path.display()
                )));
            }
            index
                .objects
                .push((id.to_hex(), buf.len() as u64, bytes.len() as u64));
            buf.extend_from_slice(&bytes);
        }
        let pack = blake3::hash(&buf).to_hex().to_string();
        let what = format!("uploading pack {pack}");
        self.store
            .put(&self.layout.pack(project, &pack), PutPayload::from(buf))
            .await
            .map_err(|e| self.error(&what, e))?;
        let idx = serde_json::to_vec(&index).map_err(|e| Error::Failed(e.to_string()))?;
        self.store
            .put(
                &self.layout.pack_index(project, &pack),
                PutPayload::from(idx),
            )
            .await
            .map_err(|e| self.error(&what, e))?;
        Ok(index
            .objects
            .into_iter()
            .zip(group)
            .map(|((_, offset, len), (id, _, _))| {
                let loc = Location {
                    pack: pack.clone(),
                    offset,
                    len,
                };
                (*id, loc)
            })
            .collect())
    }

    /// Fetches the packed objects `wanted` (id, where) into temp files named by `temp`, one
    /// ranged read per pack (near ranges coalesced), verifying each object's blake3 and length.
    ///
    /// Errors: [`Error::Failed`] for a mismatch (a corrupt pack) or a remote error.
    pub async fn download_packed(
        &self,
        project: &ProjectId,
        wanted: &[(ObjectId, Location)],
        temp: &(dyn Fn(&ObjectId) -> PathBuf + Sync),
    ) -> Result<Vec<(ObjectId, PathBuf)>> {
        let mut by_pack: HashMap<&str, Vec<&(ObjectId, Location)>> = HashMap::new();
        for w in wanted {
            by_pack.entry(w.1.pack.as_str()).or_default().push(w);
        }
        let done = futures::stream::iter(by_pack.into_iter().map(|(pack, mut objs)| async move {
            objs.sort_by_key(|o| o.1.offset);
            let ranges: Vec<_> = objs
                .iter()
                .map(|o| o.1.offset..o.1.offset + o.1.len)
                .collect();
            let what = format!("downloading pack {pack}");
            let t = std::time::Instant::now();
            let parts = self
                .store
                .get_ranges(&self.layout.pack(project, pack), &ranges)
                .await
                .map_err(|e| self.error(&what, e))?;
            tracing::debug!(
                pack,
                ranges = ranges.len(),
                ms = t.elapsed().as_millis() as u64,
                "pack fetched"
            );
            // Verify and write on the blocking pool: file creation waits on the disk, and
            // several packs' objects are written at once.
            let jobs: Vec<(ObjectId, u64, PathBuf)> =
                objs.iter().map(|o| (o.0, o.1.len, temp(&o.0))).collect();
            let (url, pack) = (self.cfg.url.clone(), pack.to_string());
            let out = tokio::task::spawn_blocking(move || {
                let mut out = Vec::with_capacity(jobs.len());
                for ((id, len, dst), bytes) in jobs.into_iter().zip(parts) {
                    if bytes.len() as u64 != len || blake3::hash(&bytes).as_bytes() != &id.0 {
                        return Err(Error::Failed(format!(
                            "remote {url}: object {id} in pack {pack}: the bytes received do not \
                             match its id (a corrupt pack)"
                        )));
                    }
                    write_new(&dst, &bytes)?;
                    out.push((id, dst));
                }
                Ok(out)
            })
            .await
            .map_err(|e| Error::Failed(format!("writing pulled objects: {e}")))??;
            Ok::<_, Error>(out)
        }))
        .buffer_unordered(PACK_PARALLEL.min(self.cfg.concurrency))
        .try_collect::<Vec<_>>()
        .await?;
        Ok(done.into_iter().flatten().collect())
    }
}

fn write_new(dst: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = fs::File::create_new(dst).at(dst)?;
    f.write_all(bytes).at(dst)
}
