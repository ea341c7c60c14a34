//! Spec validation for the API and the editor.
//!
//! Validation is [`crate::spec::parse`], the CLI's own: its message `field: text` becomes a
//! [`FieldError`] with the line of the spec the field is on. The stored specs themselves are
//! the store's (src/store/specs.rs).

use super::errors::{AppError, FieldError};
use crate::spec::Spec;

/// The largest spec accepted, bytes.
pub const MAX_SPEC_BYTES: usize = 256 * 1024;

/// Parses and validates `text` like `layercache run --spec` does.
///
/// Errors: [`AppError::Invalid`] with a [`FieldError`] per bad field (see
/// [`crate::spec::parse_all`]; `spec` for a syntax error, with its line).
pub fn validate(text: &str) -> Result<Spec, AppError> {
    if text.len() > MAX_SPEC_BYTES {
        return Err(AppError::Invalid(vec![FieldError {
            field: "spec".into(),
            message: format!(
                "spec is {} bytes; at most {MAX_SPEC_BYTES} are accepted",
                text.len()
            ),
            line: None,
        }]));
    }
    crate::spec::parse_all(text).map_err(|errors| {
        let errors = errors.into_iter().map(|m| field_error(text, &m)).collect();
        AppError::Invalid(errors)
    })
}

/// Splits a spec error message (one of [`crate::spec::parse_all`]'s) into the field it names
/// and its message, and finds the field's line in `text`.
pub fn field_error(text: &str, msg: &str) -> FieldError {
    let msg = msg.to_string();
    // The validator's messages read `project: …` or `cache[i].field: …`.
    if let Some((head, _)) = msg.split_once(": ")
        && is_field_path(head)
    {
        return FieldError {
            field: head.to_string(),
            line: field_line(text, head),
            message: msg,
        };
    }
    // A syntax error: `TOML syntax error at line 3, column 5: …` or JSON's
    // `… at line 3 column 5`.
    FieldError {
        field: "spec".into(),
        line: syntax_line(&msg),
        message: msg,
    }
}

fn is_field_path(s: &str) -> bool {
    if s == "project" || s == "user" {
        return true;
    }
    let Some(rest) = s.strip_prefix("cache[") else {
        return false;
    };
    let Some((n, field)) = rest.split_once("].") else {
        return false;
    };
    n.bytes().all(|b| b.is_ascii_digit())
        && !field.is_empty()
        && field.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
}

/// The 1-based line a field path (`project`, `cache[1].preset`) is on in a TOML spec: the line
/// of the key inside the `i`-th `[[cache]]` table, else the table's header line.
fn field_line(text: &str, field: &str) -> Option<usize> {
    let key_at = |line: &str, key: &str| {
        let l = line.trim_start();
        l.strip_prefix(key)
            .is_some_and(|r| r.trim_start().starts_with('='))
    };
    let lines: Vec<&str> = text.lines().collect();
    if field == "project" || field == "user" {
        return lines.iter().position(|l| key_at(l, field)).map(|i| i + 1);
    }
    let rest = field.strip_prefix("cache[")?;
    let (n, key) = rest.split_once("].")?;
    let n: usize = n.parse().ok()?;
    let headers: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| {
            let t = l.trim();
            t.starts_with("[[cache]]") || t.starts_with("[[caches]]")
        })
        .map(|(i, _)| i)
        .collect();
    let start = *headers.get(n)?;
    let end = headers.get(n + 1).copied().unwrap_or(lines.len());
    let found = (start..end).find(|&i| key_at(lines[i], key));
    Some(found.unwrap_or(start) + 1)
}

fn syntax_line(msg: &str) -> Option<usize> {
    let at = msg.find("line ")?;
    let digits: String = msg[at + 5..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_errors_name_the_field_and_line() {
        let text = "project = \"p\"\n\n[[cache]]\nid = \"a\"\npreset = \"npm\"\n\n[[cache]]\nid = \"b\"\npreset = \"nope\"\n";
        let AppError::Invalid(errs) = validate(text).unwrap_err() else {
            panic!()
        };
        assert_eq!(errs[0].field, "cache[1].preset");
        assert_eq!(errs[0].line, Some(9));
        assert!(errs[0].message.contains("unknown preset"), "{errs:?}");
        // Two bad caches: both are reported, each on its own line, and every bad field of
        // each (cache[1] has neither setup nor key files).
        let two =
            "project = \"p\"\n[[cache]]\nid = \"a\"\npreset = \"x\"\n\n[[cache]]\nid = \"b\"\n";
        let AppError::Invalid(errs) = validate(two).unwrap_err() else {
            panic!()
        };
        let fields: Vec<_> = errs.iter().map(|e| (e.field.as_str(), e.line)).collect();
        assert_eq!(
            fields,
            [
                ("cache[0].preset", Some(4)),
                ("cache[1].setup", Some(6)),
                ("cache[1].key_files", Some(6))
            ],
            "{errs:?}"
        );
        let AppError::Invalid(errs) = validate("project = \"a/b\"\n").unwrap_err() else {
            panic!()
        };
        assert_eq!((errs[0].field.as_str(), errs[0].line), ("project", Some(1)));
        let AppError::Invalid(errs) = validate("project = \n").unwrap_err() else {
            panic!()
        };
        assert_eq!((errs[0].field.as_str(), errs[0].line), ("spec", Some(1)));
        let AppError::Invalid(errs) = validate("project = \"p\"\nuser = \"a b\"\n").unwrap_err()
        else {
            panic!()
        };
        assert_eq!((errs[0].field.as_str(), errs[0].line), ("user", Some(2)));
        // A type error is a field error with its line, and hides no other cache's error.
        let typed = "project = \"p\"\n[[cache]]\nid = \"a\"\nsetup = 5\n[[cache]]\nid = \"b\"\npreset = \"x\"\n";
        let AppError::Invalid(errs) = validate(typed).unwrap_err() else {
            panic!()
        };
        let fields: Vec<_> = errs.iter().map(|e| (e.field.as_str(), e.line)).collect();
        assert_eq!(
            fields,
            [
                ("cache[0].setup", Some(4)),
                ("cache[0].key_files", Some(2)),
                ("cache[1].preset", Some(7))
            ],
            "{errs:?}"
        );
    }
}
