//! Layer roots (directory fds opened before mounting) and checks of the upper filesystem.

use std::path::Path;

use crate::error::{Error, Result};

/// Checks that the upper/work filesystem supports what the overlay needs: d_type, xattrs
/// (`trusted.*` as root), whiteouts (mknod of a 0/0 character device) and rename.
///
/// Errors: [`Error::Invalid`] naming the upperdir and the missing feature.
pub fn probe_upper(upper: &Path, work: &Path) -> Result<()> {
    let _ = upper;
    let probe = work.join(".layercache-probe");
    let _ = std::fs::remove_dir_all(&probe);
    std::fs::create_dir(&probe).map_err(|e| {
        Error::invalid(format!("workdir {}: not writable: {e}", work.display()))
    })?;
    let result = (|| -> std::result::Result<(), String> {
        let dir = std::fs::File::open(&probe).map_err(|e| e.to_string())?;
        use std::os::fd::AsFd;
        crate::overlay::whiteout::set_opaque(dir.as_fd()).map_err(|e| format!("no xattr support ({e})"))?;
        crate::overlay::whiteout::create_whiteout(dir.as_fd(), std::ffi::OsStr::new("wh"))
            .map_err(|e| format!("cannot create whiteouts ({e}); run as root"))?;
        let mut saw_dtype = false;
        for ent in std::fs::read_dir(&probe).map_err(|e| e.to_string())? {
            let ent = ent.map_err(|e| e.to_string())?;
            saw_dtype |= ent.file_type().map(|t| {
                use std::os::unix::fs::FileTypeExt;
                t.is_char_device()
            }).unwrap_or(false);
        }
        if !saw_dtype {
            return Err("no d_type support".into());
        }
        std::fs::rename(probe.join("wh"), probe.join("wh2")).map_err(|e| format!("rename fails ({e})"))?;
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&probe);
    result.map_err(|why| {
        Error::invalid(format!(
            "upperdir {}: its filesystem cannot hold an overlay upper layer: {why}",
            upper.display()
        ))
    })
}
