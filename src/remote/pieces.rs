//! Piece digests of the objects a layer stores alone: what lets a lazy mount serve a big
//! object's bytes piece by piece, each verified before a reader sees it.
//!
//! An object's id is the blake3 hash of its bytes, and blake3 is a tree: a piece of
//! [`PIECE_LEN`] bytes at a multiple of [`PIECE_LEN`] is a whole subtree of it, whose
//! chaining value (CV) is `blake3::hazmat`'s non-root hash of that piece at its offset
//! (the construction of Bao, the BLAKE3 team's verified streaming). A push records every
//! piece's CV; a reader checks that they merge to the object's id (so a table can only be
//! right or refused, whoever serves it) and then each fetched piece against its CV.
//!
//! The table of a layer is `manifests/<layer>.pieces` in the remote ([`encode`]): [`MAGIC`],
//! the piece length (u64 little-endian) and a postcard `Vec<([u8; 32], Vec<[u8; 32]>)>` —
//! (object id, its pieces' CVs), for each object stored alone that is longer than one piece.
//! Layers pushed before it have none: their big objects are fetched whole, verified, then
//! served.

use std::io::Read;

use blake3::hazmat::{
    ChainingValue, HasherExt, Mode, merge_subtrees_non_root, merge_subtrees_root,
};

use crate::error::{Error, Result};

/// Bytes of one piece (1 MiB: 1024 blake3 chunks, a power of two, so every piece but the last
/// is a full subtree).
pub const PIECE_LEN: u64 = 1 << 20;

/// The first bytes of a piece table.
pub const MAGIC: &[u8; 9] = b"LCPIECE1\n";

/// The CV of the piece `bytes` starting at byte `offset` of its object (`offset` a multiple
/// of [`PIECE_LEN`]).
pub fn piece_cv(offset: u64, bytes: &[u8]) -> ChainingValue {
    let mut h = blake3::Hasher::new();
    h.set_input_offset(offset);
    h.update(bytes);
    h.finalize_non_root()
}

/// How many pieces an object of `size` bytes has (at least one).
pub fn count(size: u64) -> u64 {
    size.div_ceil(PIECE_LEN).max(1)
}

/// The CVs of the `size` bytes `r` yields, piece by piece.
///
/// Errors: the read's, or `UnexpectedEof` when `r` ends before `size` bytes.
pub fn cvs_of(mut r: impl Read, size: u64) -> std::io::Result<Vec<ChainingValue>> {
    let mut buf = vec![0u8; PIECE_LEN.min(size) as usize];
    let mut out = Vec::with_capacity(count(size) as usize);
    let mut at = 0u64;
    while at < size {
        let n = (size - at).min(PIECE_LEN) as usize;
        r.read_exact(&mut buf[..n])?;
        out.push(piece_cv(at, &buf[..n]));
        at += n as u64;
    }
    Ok(out)
}

/// Whether `cvs` are the pieces of an object of `size` bytes (more than one piece) whose
/// blake3 hash is `id`: they merge, in blake3's tree shape, to that root.
pub fn matches(cvs: &[ChainingValue], size: u64, id: &[u8; 32]) -> bool {
    if size <= PIECE_LEN || cvs.len() as u64 != count(size) {
        return false;
    }
    let left = blake3::hazmat::left_subtree_len(size);
    let (l, r) = cvs.split_at((left / PIECE_LEN) as usize);
    let root = merge_subtrees_root(&subtree(l, left), &subtree(r, size - left), Mode::Hash);
    root.as_bytes() == id
}

/// The non-root CV of the subtree of `len` bytes whose pieces are `cvs`.
fn subtree(cvs: &[ChainingValue], len: u64) -> ChainingValue {
    if len <= PIECE_LEN {
        return cvs[0];
    }
    let left = blake3::hazmat::left_subtree_len(len);
    let (l, r) = cvs.split_at((left / PIECE_LEN) as usize);
    merge_subtrees_non_root(&subtree(l, left), &subtree(r, len - left), Mode::Hash)
}

/// A layer's piece table: (object id, its pieces' CVs).
pub type Table = Vec<([u8; 32], Vec<ChainingValue>)>;

/// The piece table `t` as stored in the remote (see the module docs).
///
/// Errors: [`Error::Failed`] when postcard cannot encode it.
pub fn encode(t: &Table) -> Result<Vec<u8>> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&PIECE_LEN.to_le_bytes());
    let body = postcard::to_stdvec(t).map_err(|e| Error::Failed(format!("piece table: {e}")))?;
    out.extend_from_slice(&body);
    Ok(out)
}

/// The piece table in `bytes` (as [`encode`] writes it). Its CVs are not checked here: a
/// reader checks each object's with [`matches`].
///
/// Errors: [`Error::Failed`] naming what is wrong: no [`MAGIC`], another piece length, or a
/// body that does not decode.
pub fn decode(bytes: &[u8]) -> Result<Table> {
    let bad = |why: &str| Error::Failed(format!("piece table: {why}"));
    let rest = bytes
        .strip_prefix(MAGIC.as_slice())
        .ok_or_else(|| bad("it does not start with the piece table's magic bytes"))?;
    let (len, body) = rest
        .split_first_chunk::<8>()
        .ok_or_else(|| bad("it ends before its piece length"))?;
    let len = u64::from_le_bytes(*len);
    if len != PIECE_LEN {
        return Err(bad(&format!(
            "pieces of {len} bytes; this version reads pieces of {PIECE_LEN}"
        )));
    }
    let (t, left): (Table, &[u8]) =
        postcard::take_from_bytes(body).map_err(|e| bad(&e.to_string()))?;
    if !left.is_empty() {
        return Err(bad(&format!("{} bytes after its end", left.len())));
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(n: u64) -> Vec<u8> {
        let mut v = Vec::with_capacity(n as usize);
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            v.push(x as u8);
        }
        v
    }

    #[test]
    fn pieces_merge_to_the_objects_blake3_hash_for_every_shape_of_tree() {
        for size in [
            PIECE_LEN + 1,
            2 * PIECE_LEN,
            2 * PIECE_LEN + 7,
            3 * PIECE_LEN,
            5 * PIECE_LEN - 1,
            8 * PIECE_LEN,
            9 * PIECE_LEN + 1000,
        ] {
            let data = bytes(size);
            let id = *blake3::hash(&data).as_bytes();
            let cvs = cvs_of(&data[..], size).unwrap();
            assert_eq!(cvs.len() as u64, count(size), "{size}");
            assert!(matches(&cvs, size, &id), "{size}");
            // Each piece checks against its own CV, and against no other.
            for (i, cv) in cvs.iter().enumerate() {
                let at = i as u64 * PIECE_LEN;
                let end = (at + PIECE_LEN).min(size);
                assert_eq!(&piece_cv(at, &data[at as usize..end as usize]), cv);
            }
            // A changed CV, a missing one or another piece count is refused. (Another length
            // with the same pieces merges to the same root: the last piece's bytes then fail
            // their own check.)
            let mut bad = cvs.clone();
            bad[cvs.len() / 2][0] ^= 1;
            assert!(!matches(&bad, size, &id), "{size}");
            assert!(!matches(&cvs[1..], size, &id), "{size}");
            assert!(!matches(&cvs, size + PIECE_LEN, &id), "{size}");
        }
        // One piece or less: no table (the id is the whole check).
        let data = bytes(PIECE_LEN);
        let cvs = cvs_of(&data[..], PIECE_LEN).unwrap();
        assert!(!matches(&cvs, PIECE_LEN, blake3::hash(&data).as_bytes()));
    }

    #[test]
    fn a_piece_table_reads_back_and_a_damaged_one_is_refused() {
        let t: Table = vec![([7u8; 32], vec![[1u8; 32], [2u8; 32]]), ([9u8; 32], vec![])];
        let e = encode(&t).unwrap();
        assert_eq!(decode(&e).unwrap(), t);
        let msg = |b: &[u8]| decode(b).unwrap_err().to_string();
        assert!(msg(&e[1..]).contains("magic"), "{}", msg(&e[1..]));
        let mut other = e.clone();
        other[MAGIC.len() + 2] = 0x20; // 2 MiB pieces
        assert!(msg(&other).contains("this version reads pieces of"));
        assert!(msg(&e[..e.len() - 1]).starts_with("piece table:"));
        let mut longer = e.clone();
        longer.push(0);
        assert!(msg(&longer).contains("after its end"));
    }

    #[test]
    fn a_short_reader_is_an_error() {
        let data = bytes(PIECE_LEN + 10);
        let e = cvs_of(&data[..], PIECE_LEN + 11).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    }
}
