//! Access control, in one middleware in front of every route:
//!
//! * **Host** (DNS rebinding): without a token only loopback host names are answered
//!   (`localhost`, `127.0.0.1`, `[::1]`, with any port), so a page on another site that
//!   rebinds its name to 127.0.0.1 cannot read the store.
//! * **Same origin** for state-changing methods (POST, PUT, DELETE, PATCH), after Go's
//!   `net/http.CrossOriginProtection`: `Sec-Fetch-Site` must be `same-origin` or `none` when
//!   sent; otherwise an `Origin` header must name this host; requests with neither (curl, other
//!   non-browser clients) pass, since browsers always send one of them.
//! * **Token** (when `--token-file` is given): every API call and page needs
//!   `Authorization: Bearer <token>` or the `layercache_token` cookie the login form sets
//!   (`HttpOnly; SameSite=Strict`). The API answers 401; pages redirect to `/login`.

use std::sync::Arc;

use axum::Form;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;
use serde::Deserialize;

use super::AppState;
use super::errors::AppError;
use super::pages::{layout, urlencode};

/// The cookie the login form sets.
pub const COOKIE: &str = "layercache_token";
/// The shortest token accepted from `--token-file`, bytes.
pub const MIN_TOKEN: usize = 16;

/// Reads the token from `path`: its first line, trimmed.
///
/// Errors: [`crate::Error::Invalid`] naming the file when it cannot be read, when its group or
/// other users may read it, or when the token is shorter than [`MIN_TOKEN`] bytes or holds a
/// character a cookie value cannot.
pub fn read_token(path: &std::path::Path) -> crate::Result<String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| crate::Error::invalid(format!("--token-file {}: {e}", path.display())))?;
    let token = text.lines().next().unwrap_or("").trim().to_string();
    // The token travels in a cookie too: only characters a cookie value may hold unquoted.
    let cookie_safe = |b: u8| b.is_ascii_alphanumeric() || b"-._~+/=".contains(&b);
    if token.len() < MIN_TOKEN || !token.bytes().all(cookie_safe) {
        return Err(crate::Error::invalid(format!(
            "--token-file {}: want a token of at least {MIN_TOKEN} characters from A-Z a-z 0-9 \
             - . _ ~ + / = on its first line (e.g. `head -c 32 /dev/urandom | base64 > FILE`)",
            path.display()
        )));
    }
    // Like OpenSSH with a private key: a secret others can read is refused, not used.
    use std::os::unix::fs::PermissionsExt;
    if let Ok(m) = std::fs::metadata(path)
        && m.permissions().mode() & 0o044 != 0
    {
        return Err(crate::Error::invalid(format!(
            "--token-file {}: readable by other users (mode {:03o}); `chmod 600` it",
            path.display(),
            m.permissions().mode() & 0o777
        )));
    }
    Ok(token)
}

/// Compares in time independent of where the strings differ.
fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// Whether the request carries `token` (bearer header or cookie).
pub fn has_token(headers: &HeaderMap, token: &str) -> bool {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    bearer.is_some_and(|t| same_secret(t.trim(), token))
        || cookie(headers, COOKIE).is_some_and(|t| same_secret(t, token))
}

fn host_is_loopback(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        host.rsplit_once(':').map_or(host, |(h, _)| h)
    };
    // An address in 127.0.0.0/8 must parse as one: a prefix test would accept names such as
    // `127.0.0.1.attacker.example`, which a DNS-rebinding page can own.
    name == "localhost"
        || name == "::1"
        || name
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|a| a.is_loopback())
}

/// The same-origin rule (see the module docs).
///
/// Errors: 403 naming the header that showed another origin.
pub fn check_same_origin(headers: &HeaderMap) -> Result<(), AppError> {
    let get = |h: &str| headers.get(h).and_then(|v| v.to_str().ok());
    if let Some(site) = get("sec-fetch-site") {
        return match site {
            "same-origin" | "none" => Ok(()),
            other => Err(AppError::Forbidden(format!(
                "cross-origin request refused (Sec-Fetch-Site: {other}): state-changing \
                 requests must come from this server's own pages"
            ))),
        };
    }
    let (Some(origin), Some(host)) = (get("origin"), get("host")) else {
        return Ok(());
    };
    let origin_host = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        .unwrap_or("");
    if origin_host == host {
        return Ok(());
    }
    Err(AppError::Forbidden(format!(
        "cross-origin request refused (Origin {origin} is not http://{host})"
    )))
}

fn is_api(path: &str) -> bool {
    path == "/api" || path.starts_with("/api/")
}

/// The middleware (see the module docs).
pub async fn guard(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let headers = req.headers();
    let path = req.uri().path().to_string();
    if st.token.is_none() {
        let host = headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !host_is_loopback(host) {
            return AppError::Forbidden(format!(
                "Host {host:?} refused: without --token-file only loopback names are served"
            ))
            .into_response();
        }
    }
    let unsafe_method = !matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    if unsafe_method && let Err(e) = check_same_origin(headers) {
        return e.into_response();
    }
    if let Some(token) = &st.token
        && path != "/login"
        && !has_token(headers, token)
    {
        if is_api(&path) {
            return AppError::Unauthorized(
                "this server needs a token: send Authorization: Bearer <token>".into(),
            )
            .into_response();
        }
        let next_path = req
            .uri()
            .path_and_query()
            .map_or("/".to_string(), |p| p.to_string());
        return Redirect::to(&format!("/login?next={}", urlencode(&next_path))).into_response();
    }
    next.run(req).await
}

/// Where to go after logging in: a local path only (no `//host`, no scheme).
fn local_next(next: Option<&str>) -> String {
    match next {
        Some(n) if n.starts_with('/') && !n.starts_with("//") && !n.contains('\\') => n.into(),
        _ => "/".into(),
    }
}

/// The `?next=` of the login page.
#[derive(Debug, Deserialize)]
pub struct NextQuery {
    /// The page to return to.
    pub next: Option<String>,
}

fn login_page(next: &str, error: Option<&str>) -> maud::Markup {
    layout(
        "Log in",
        html! {
            h1 { "Log in" }
            @if let Some(e) = error { p.refused role="alert" { (e) } }
            form method="post" action="/login" {
                input type="hidden" name="next" value=(next);
                label for="token" { "Token" }
                input #token type="password" name="token" autocomplete="current-password" required;
                button type="submit" { "Log in" }
            }
        },
    )
}

/// `GET /login`.
pub async fn login_form(Query(q): Query<NextQuery>) -> maud::Markup {
    login_page(&local_next(q.next.as_deref()), None)
}

/// The login form's fields.
#[derive(Debug, Deserialize)]
pub struct LoginForm {
    /// The token typed in.
    pub token: String,
    /// The page to return to.
    pub next: Option<String>,
}

/// `POST /login`: sets the cookie and returns to `next`, or 401 with the form again.
pub async fn login(State(st): State<Arc<AppState>>, Form(f): Form<LoginForm>) -> Response {
    let next = local_next(f.next.as_deref());
    match &st.token {
        Some(t) if same_secret(f.token.trim(), t) => {
            let cookie = format!("{COOKIE}={t}; Path=/; HttpOnly; SameSite=Strict");
            ([(header::SET_COOKIE, cookie)], Redirect::to(&next)).into_response()
        }
        Some(_) => (
            StatusCode::UNAUTHORIZED,
            login_page(&next, Some("Wrong token.")),
        )
            .into_response(),
        None => Redirect::to(&next).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules() {
        assert!(host_is_loopback("127.0.0.1:7878"));
        assert!(host_is_loopback("127.1.2.3"));
        assert!(host_is_loopback("[::1]:80"));
        for evil in [
            "127.0.0.1.nip.io",
            "127.evil.example:1",
            "127.0.0.1evil",
            "127.0.0.1@evil.example",
            "localhost.evil.example",
        ] {
            assert!(!host_is_loopback(evil), "{evil}");
        }
        assert!(host_is_loopback("localhost"));
        assert!(host_is_loopback("[::1]:80"));
        assert!(!host_is_loopback("evil.example:7878"));
        let mut h = HeaderMap::new();
        assert!(check_same_origin(&h).is_ok());
        h.insert("host", "127.0.0.1:1".parse().unwrap());
        h.insert("origin", "http://127.0.0.1:1".parse().unwrap());
        assert!(check_same_origin(&h).is_ok());
        h.insert("origin", "http://evil.example".parse().unwrap());
        assert!(check_same_origin(&h).is_err());
        h.insert("sec-fetch-site", "cross-site".parse().unwrap());
        assert!(check_same_origin(&h).is_err());
        h.insert("sec-fetch-site", "same-origin".parse().unwrap());
        assert!(check_same_origin(&h).is_ok());
        assert_eq!(local_next(Some("//evil")), "/");
        assert_eq!(local_next(Some("/projects/a")), "/projects/a");
        let mut h = HeaderMap::new();
        h.insert("cookie", "a=b; layercache_token=secret".parse().unwrap());
        assert!(has_token(&h, "secret"));
        assert!(!has_token(&h, "secreT"));
        assert_eq!(urlencode("/a b?x=1"), "%2Fa%20b%3Fx%3D1");
    }
}
