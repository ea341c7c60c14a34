//! The single mapping from `io::Error` to the errno a FUSE reply carries.

use fuser::Errno;

/// Result type of the engine's operations: an errno for the kernel on failure.
pub(crate) type OpResult<T> = std::result::Result<T, Errno>;

/// [`to_errno`] of an owned error (for `map_err`).
pub(crate) fn errno(e: std::io::Error) -> Errno {
    to_errno(&e)
}

/// Maps an `io::Error` to the errno sent to the kernel. An error without an OS code (a bug or
/// a library error) becomes `EIO` and is logged, so it is never silently misreported.
pub fn to_errno(err: &std::io::Error) -> Errno {
    match err.raw_os_error() {
        Some(code) if code > 0 => Errno::from_i32(code),
        _ => {
            tracing::warn!(error = %err, "error without an OS code mapped to EIO");
            Errno::EIO
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_errors_keep_their_code_and_others_become_eio() {
        let e = std::io::Error::from_raw_os_error(libc::ENOTEMPTY);
        assert_eq!(to_errno(&e).code(), libc::ENOTEMPTY);
        let e = std::io::Error::other("no code");
        assert_eq!(to_errno(&e).code(), libc::EIO);
    }
}
