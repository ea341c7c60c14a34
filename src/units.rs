//! Sizes and durations as config.toml and the command line write them (`20G`, `512MiB`, `30d`,
//! `90m`, `none`): the parsers the store's `[limits]`, the remote's `[remote]` and the `gc` /
//! `remote gc` flags share; and the crate's wall clock ([`now_ms`]). A leaf: it names nothing
//! of the crate but its error type.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};

/// Whether a limit's value is the word `none` (any case, surrounding blanks ignored), which
/// disables the limit in config.toml and on the command line.
pub fn means_no_limit(s: &str) -> bool {
    s.trim().eq_ignore_ascii_case("none")
}

/// Parses an inode limit as the command line takes it: a whole number, or `none`; `none` or 0
/// → `None` (unlimited).
///
/// Errors: a message naming the input, e.g. `"-1" is not a whole number (want 0, 1, 2, …) or
/// "none"`.
pub fn parse_count(s: &str) -> std::result::Result<Option<u64>, String> {
    if means_no_limit(s) {
        return Ok(None);
    }
    match s.parse::<u64>() {
        Ok(0) => Ok(None),
        Ok(n) => Ok(Some(n)),
        Err(_) => Err(format!(
            "{s:?} is not a whole number (want 0, 1, 2, …) or \"none\""
        )),
    }
}

/// Parses a size: a number with an optional binary unit `K`, `M`, `G`, `T` (optionally followed
/// by `i`/`B`, e.g. `10G`, `512MiB`, `4096`); `none` or `0` → `None` (unlimited).
///
/// Hand-written rather than bytesize: bytesize reads `20G`/`20GB` as decimal (10^9) units,
/// while config.toml and `--max-size` have always meant binary ones.
///
/// Errors: [`Error::Invalid`] naming the input.
pub fn parse_size(s: &str) -> Result<Option<u64>> {
    let t = s.trim();
    if means_no_limit(t) {
        return Ok(None);
    }
    let bad = || {
        Error::invalid(format!(
            "invalid size {s:?}: want e.g. 512M, 20G, 4096 or none"
        ))
    };
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| bad())?;
    let unit = unit.trim().to_ascii_uppercase();
    let unit = unit.trim_end_matches('B').trim_end_matches('I');
    let mult: u64 = match unit {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        _ => return Err(bad()),
    };
    let v = n.checked_mul(mult).ok_or_else(bad)?;
    Ok(if v == 0 { None } else { Some(v) })
}

/// Parses a duration: a number of seconds, or humantime's syntax (`30d`, `12h`, `90m`,
/// `3600s`, `1w`, `1h 30m`); `none` or `0` → `None` (unlimited).
///
/// Errors: [`Error::Invalid`] naming the input.
pub fn parse_duration(s: &str) -> Result<Option<Duration>> {
    let t = s.trim();
    if means_no_limit(t) {
        return Ok(None);
    }
    let d = match t.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => humantime::parse_duration(t).map_err(|e| {
            Error::invalid(format!(
                "invalid duration {s:?} ({e}): want e.g. 3600s, 90m, 12h, 30d or none"
            ))
        })?,
    };
    Ok((!d.is_zero()).then_some(d))
}

/// Formats seconds for a message: whole ones as an integer (`10`), others with one decimal
/// (`2.7`, `0.5`).
pub fn fmt_secs(secs: f64) -> String {
    if secs.fract() == 0.0 {
        format!("{secs:.0}")
    } else {
        format!("{secs:.1}")
    }
}

/// Milliseconds since the Unix epoch, now (0 for a clock before 1970). Layer, run and
/// telemetry times are all this.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Formats a size in bytes in binary units: `512 B`, `1.5 KiB`, `12.3 MiB` (one decimal from
/// KiB up, TiB at most).
pub fn fmt_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

/// `n` files as a person would write it: `1 file`, `0 files`, `10428 files`.
pub fn fmt_files(n: u64) -> String {
    if n == 1 {
        "1 file".to_string()
    } else {
        format!("{n} files")
    }
}

/// `bytes` as lowercase hex, two digits a byte (what salts, tokens, digests and temporary
/// names are written as).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_read_as_people_write_them() {
        assert_eq!(fmt_secs(10.0), "10");
        assert_eq!(fmt_secs(2.666_666_666_000_000_2), "2.7");
        assert_eq!(fmt_secs(0.5), "0.5");
    }

    #[test]
    fn file_counts_read_as_words() {
        assert_eq!(fmt_files(0), "0 files");
        assert_eq!(fmt_files(1), "1 file");
        assert_eq!(fmt_files(10428), "10428 files");
    }

    #[test]
    fn parses_sizes_and_durations() {
        assert_eq!(parse_size("10G").unwrap(), Some(10 << 30));
        assert_eq!(parse_size("512MiB").unwrap(), Some(512 << 20));
        assert_eq!(parse_size("4096").unwrap(), Some(4096));
        assert_eq!(parse_size("none").unwrap(), None);
        assert!(parse_size("10X").unwrap_err().to_string().contains("10X"));
        assert_eq!(
            parse_duration("30d").unwrap(),
            Some(Duration::from_secs(30 * 86400))
        );
        assert_eq!(
            parse_duration("90m").unwrap(),
            Some(Duration::from_secs(5400))
        );
        assert!(parse_duration("-1h").is_err());
        assert_eq!(parse_count("none"), Ok(None));
        assert_eq!(parse_count("0"), Ok(None));
        assert_eq!(parse_count("7"), Ok(Some(7)));
        assert!(parse_count("-1").unwrap_err().contains("\"-1\""));
    }
}
