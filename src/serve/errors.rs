//! The one application error of the server: every handler returns `Result<_, AppError>` and the
//! status code is decided here (axum's `examples/error-handling`).
//!
//! JSON bodies (the API): `{"error": message, …}` plus what the client needs to act on it —
//! `exists` (404: the names that do exist), `in_use` (409: the mounted layers), `errors`
//! (422: `[{"field", "message"}]`). Pages render the same error as HTML through
//! [`crate::serve::pages`].

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::error::Error;

/// One validation error, naming the field it is about (`project`, `cache[0].preset`, `body`,
/// `spec` for a syntax error), with the CLI's message and, when known, the 1-based line of the
/// spec text it points at.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FieldError {
    /// The field path, as the CLI's message names it.
    pub field: String,
    /// The message (the same text `layercache` prints).
    pub message: String,
    /// The 1-based line of the spec the field is on, when it can be found.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<usize>,
}

impl FieldError {
    /// The message without the `field: ` it usually starts with, for showing next to the field.
    pub fn detail(&self) -> &str {
        self.message
            .strip_prefix(&self.field)
            .and_then(|m| m.strip_prefix(": "))
            .unwrap_or(&self.message)
    }
}

/// What went wrong, with its HTTP status (see the module docs).
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// 400: a path segment or parameter is not a valid id (the CLI's message names it).
    #[error("{0}")]
    BadId(String),
    /// 400: another bad request (a malformed body, a bad parameter).
    #[error("{0}")]
    BadRequest(String),
    /// 401: no or a wrong token.
    #[error("{0}")]
    Unauthorized(String),
    /// 403: a state-changing request from another origin, or a foreign Host.
    #[error("{0}")]
    Forbidden(String),
    /// 404: `what` does not exist; `exists` lists what does.
    #[error("{what}: not found")]
    NotFound {
        /// What was asked for, e.g. `project acme`.
        what: String,
        /// The names that exist at that level.
        exists: Vec<String>,
    },
    /// 409: layers in use (mounted) were refused; the others were cleared.
    #[error("{message}")]
    InUse {
        /// What happened, naming the refused layers.
        message: String,
        /// The refused layer ids.
        in_use: Vec<String>,
        /// The layer ids that were removed all the same.
        removed: Vec<String>,
    },
    /// 415: a body of a type the endpoint does not take.
    #[error("{0}")]
    UnsupportedType(String),
    /// 422: the body was read but is not valid.
    #[error("invalid: {}", .0.iter().map(|e| format!("{}: {}", e.field, e.detail())).collect::<Vec<_>>().join("; "))]
    Invalid(Vec<FieldError>),
    /// 500: the store failed (I/O); logged.
    #[error("{0}")]
    Internal(String),
}

impl AppError {
    /// The HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        match self {
            AppError::BadId(_) | AppError::BadRequest(_) => StatusCode::BAD_REQUEST,
            AppError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            AppError::Forbidden(_) => StatusCode::FORBIDDEN,
            AppError::NotFound { .. } => StatusCode::NOT_FOUND,
            AppError::InUse { .. } => StatusCode::CONFLICT,
            AppError::UnsupportedType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            AppError::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
            AppError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The JSON body of this error (see the module docs).
    pub fn body(&self) -> serde_json::Value {
        let mut v = serde_json::json!({ "error": self.to_string() });
        match self {
            AppError::NotFound { exists, .. } => v["exists"] = serde_json::json!(exists),
            AppError::InUse {
                in_use, removed, ..
            } => {
                v["in_use"] = serde_json::json!(in_use);
                v["removed"] = serde_json::json!(removed);
            }
            AppError::Invalid(errors) => {
                v["ok"] = serde_json::json!(false);
                v["errors"] = serde_json::json!(errors);
            }
            _ => {}
        }
        v
    }

    /// A library error from a call whose ids were already validated: bad input becomes 400,
    /// anything else 500.
    pub fn from_lib(e: Error) -> AppError {
        match e {
            Error::Invalid(m) => AppError::BadRequest(m),
            other => AppError::Internal(other.to_string()),
        }
    }

    /// A bad id (from [`crate::ids`]) becomes a 400 naming it.
    pub fn bad_id(e: Error) -> AppError {
        AppError::BadId(e.to_string())
    }
}

impl From<Error> for AppError {
    fn from(e: Error) -> Self {
        AppError::from_lib(e)
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::error!("{self}");
        }
        let mut resp = (status, Json(self.body())).into_response();
        if status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer realm=\"layercache\""),
            );
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_bodies() {
        let nf = AppError::NotFound {
            what: "project x".into(),
            exists: vec!["a".into()],
        };
        assert_eq!(nf.status(), StatusCode::NOT_FOUND);
        assert_eq!(nf.body()["exists"][0], "a");
        let inv = AppError::Invalid(vec![FieldError {
            field: "project".into(),
            message: "bad".into(),
            line: Some(1),
        }]);
        assert_eq!(inv.status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(inv.body()["errors"][0]["field"], "project");
        assert_eq!(inv.body()["ok"], false);
        assert_eq!(
            AppError::from_lib(Error::invalid("x")).status(),
            StatusCode::BAD_REQUEST
        );
    }
}
