//! Access control, in one middleware in front of every route:
//!
//! * **Token**: every API call and page, but the login form itself, needs the token: as
//!   `Authorization: Bearer <token>`, or as the login cookie. The token is `--token-file`'s, or
//!   by default the store's own (`<store>/v1/serve-token`, made on the first start: see
//!   `token.rs`), which `serve` prints once inside a login URL (`/login?token=…`). Opening that
//!   URL (or posting the login form) sets the cookie — `layercache_session_<port>`, `HttpOnly;
//!   SameSite=Strict; Path=/`, holding a random session secret of this server process, not the
//!   token — and redirects to a URL without the token, so it stays out of the history and the
//!   Referer. The API answers 401 (`WWW-Authenticate: Bearer`); a page answers 401 with the login
//!   form. Comparisons take the same time wherever the strings differ. Like Jupyter's and
//!   code-server's, this keeps the server to whoever can read the token: on a shared host, the
//!   store's owner and root.
//! * **Host** (DNS rebinding): with the store's token only loopback host names are answered
//!   (`localhost`, `127.0.0.1`, `[::1]`, with any port), so a page on another site that
//!   rebinds its name to 127.0.0.1 meets a 403 before anything else.
//! * **Same origin** for state-changing methods (POST, PUT, DELETE, PATCH), after Go's
//!   `net/http.CrossOriginProtection`: `Sec-Fetch-Site` must be `same-origin` or `none` when
//!   sent; otherwise an `Origin` header must name this host; requests with neither (curl, other
//!   non-browser clients) pass, since browsers always send one of them.

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
use super::pages::layout;

/// The login cookie's name before its `_<port>` suffix (cookies are shared by every port of a
/// host, so two servers on one machine each keep their own, as Jupyter's do).
pub const COOKIE_PREFIX: &str = "layercache_session";
/// The shortest token accepted from `--token-file`, bytes.
pub const MIN_TOKEN: usize = 16;

/// Where the token came from, which decides the Host rule (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenSource {
    /// The store's own token (`<store>/v1/serve-token`), the default; loopback only.
    Store,
    /// `--token-file`, which also allows a non-loopback `--listen` (behind TLS).
    File,
}

/// Who may use the server: the token, the login cookie and the Host rule.
pub struct Auth {
    token: String,
    session: String,
    cookie: String,
    source: TokenSource,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secrets, even in a debug print.
        f.debug_struct("Auth")
            .field("cookie", &self.cookie)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl Auth {
    /// The rules for `token` (from `source`) on a server listening on `port`, with a new
    /// session secret (256 bits from `getrandom(2)`) for the login cookie.
    ///
    /// Errors: [`crate::Error::Io`] when the kernel gives no random bytes.
    pub fn new(token: String, source: TokenSource, port: u16) -> crate::Result<Auth> {
        Ok(Auth {
            token,
            session: super::token::random_secret()?,
            cookie: format!("{COOKIE_PREFIX}_{port}"),
            source,
        })
    }

    /// The login cookie's name, `layercache_session_<port>`.
    pub fn cookie_name(&self) -> &str {
        &self.cookie
    }

    /// The URL path that logs a browser in: `/login?token=TOKEN` for the store's token (whose
    /// hex digits need no escaping), `/login` (the form) for `--token-file`'s, which is never
    /// printed.
    pub fn login_path(&self) -> String {
        match self.source {
            TokenSource::Store => format!("/login?token={}", self.token),
            TokenSource::File => "/login".into(),
        }
    }

    /// Whether the request carries the token (bearer header) or this server's login cookie.
    pub fn allows(&self, headers: &HeaderMap) -> bool {
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        bearer.is_some_and(|t| same_secret(t.trim(), &self.token))
            || cookie(headers, &self.cookie).is_some_and(|s| same_secret(s, &self.session))
    }

    /// The `Set-Cookie` value that logs a browser in (a session cookie).
    fn set_cookie(&self) -> String {
        format!(
            "{}={}; Path=/; HttpOnly; SameSite=Strict",
            self.cookie, self.session
        )
    }
}

/// Reads the token from `path` (`--token-file`): its first line, trimmed. The checks are made
/// on the descriptor that is read (`fstat(2)` after `open(2)` with `O_NOFOLLOW`), like
/// OpenSSH's for a private key: the file must be a regular file (not a symlink), owned by this
/// process's user or by root, with no permission bits for group or others (`mode & 0o077 ==
/// 0`), so nobody else can read or swap the secret.
///
/// Errors: [`crate::Error::Invalid`] naming the file and the fix when it cannot be opened or
/// read, is a symlink or not a regular file, belongs to another user, grants group or others
/// any access, or when the token is shorter than [`MIN_TOKEN`] bytes or holds a character a
/// cookie value cannot.
pub fn read_token(path: &std::path::Path) -> crate::Result<String> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let bad =
        |what: String| crate::Error::invalid(format!("--token-file {}: {what}", path.display()));
    let (mut f, meta) = crate::sys::open_nofollow(None, path).map_err(|e| {
        match e.raw_os_error() {
        Some(libc::ELOOP) => bad(
            "a symlink; pass the file itself (`realpath` names it), so nobody can swap what it \
             points to"
                .into(),
        ),
        _ => bad(e.to_string()),
    }
    })?;
    if !meta.file_type().is_file() {
        return Err(bad("not a regular file".into()));
    }
    let euid = rustix::process::geteuid().as_raw();
    if meta.uid() != euid && meta.uid() != 0 {
        return Err(bad(format!(
            "belongs to uid {}, not to this user (uid {euid}) or root; a secret another user \
             can change is not used: `chown {euid} {}` or make your own",
            meta.uid(),
            path.display()
        )));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(bad(format!(
            "group or other users may use it (mode {:03o}); `chmod 600 {}`",
            meta.mode() & 0o777,
            path.display()
        )));
    }
    let mut text = String::new();
    // A token file is one short line: a bigger one is not a token.
    (&mut f)
        .take(64 * 1024)
        .read_to_string(&mut text)
        .map_err(|e| bad(e.to_string()))?;
    let token = text.lines().next().unwrap_or("").trim().to_string();
    // The token travels in a cookie too: only characters a cookie value may hold unquoted.
    let cookie_safe = |b: u8| b.is_ascii_alphanumeric() || b"-._~+/=".contains(&b);
    if token.len() < MIN_TOKEN || !token.bytes().all(cookie_safe) {
        return Err(bad(format!(
            "want a token of at least {MIN_TOKEN} characters from A-Z a-z 0-9 - . _ ~ + / = on \
             its first line (e.g. `head -c 32 /dev/urandom | base64 > FILE`)"
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
    if st.auth.source == TokenSource::Store {
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
    if path == "/login" || st.auth.allows(headers) {
        return next.run(req).await;
    }
    if is_api(&path) {
        return AppError::Unauthorized(
            "this server needs its token: send Authorization: Bearer <token> (the token is in \
             the file `layercache serve` named when it started)"
                .into(),
        )
        .into_response();
    }
    // A page: the login form, which returns to the page asked for once logged in (after a
    // refused form post, to the page at the same path, never re-posting the form).
    let next_path = if *req.method() == Method::GET {
        req.uri()
            .path_and_query()
            .map_or("/".to_string(), |p| p.to_string())
    } else {
        path
    };
    unauthorized_page(&st.auth, &local_next(Some(&next_path)), None)
}

/// 401 with the login form (and the `WWW-Authenticate` header 401 needs).
fn unauthorized_page(auth: &Auth, next: &str, error: Option<&str>) -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [
            (header::WWW_AUTHENTICATE, "Bearer realm=\"layercache\""),
            (header::CACHE_CONTROL, "no-store"),
        ],
        login_page(auth.source, next, error),
    )
        .into_response()
}

/// Where to go after logging in: a local path only, else `/`. Refused: anything not starting
/// with one `/` (`//host` and schemes), a backslash, and any control byte, space or DEL
/// (0x00-0x20, 0x7f) anywhere — browsers drop tabs and newlines from a `Location` (the WHATWG
/// URL parser), so `/\t/evil.example` would be read as `//evil.example`, and a newline cannot
/// go into a header at all.
fn local_next(next: Option<&str>) -> String {
    match next {
        Some(n)
            if n.starts_with('/')
                && !n.starts_with("//")
                && !n.bytes().any(|b| b == b'\\' || b <= 0x20 || b == 0x7f) =>
        {
            n.into()
        }
        _ => "/".into(),
    }
}

/// The query of the login page: `?next=` (the page to return to) and, in the login URL that
/// `serve` prints, `?token=`.
#[derive(Debug, Deserialize)]
pub struct LoginQuery {
    /// The page to return to.
    pub next: Option<String>,
    /// The token, from the printed login URL.
    pub token: Option<String>,
}

fn login_page(source: TokenSource, next: &str, error: Option<&str>) -> maud::Markup {
    layout(
        "Log in",
        html! {
            h1 { "Log in" }
            @if let Some(e) = error { p.refused role="alert" { (e) } }
            @match source {
                TokenSource::Store => p { "Open the login URL that " code { "layercache serve" }
                    " printed, or enter the store's token (in " code { "<store>/v1/serve-token" }
                    ", which only the store's owner and root can read)." },
                TokenSource::File => p { "Enter the token of the server's " code { "--token-file" } "." },
            }
            form method="post" action="/login" {
                input type="hidden" name="next" value=(next);
                label for="token" { "Token" }
                input #token type="password" name="token" autocomplete="current-password" required;
                button type="submit" { "Log in" }
            }
        },
    )
}

/// Logs in with `token` if it is the right one: the cookie and a 303 to `next`; else 401 with
/// the form again.
fn log_in(auth: &Auth, token: &str, next: &str) -> Response {
    if same_secret(token.trim(), &auth.token) {
        (
            [
                (header::SET_COOKIE, auth.set_cookie()),
                (header::CACHE_CONTROL, "no-store".into()),
            ],
            Redirect::to(next),
        )
            .into_response()
    } else {
        unauthorized_page(auth, next, Some("Wrong token."))
    }
}

/// `GET /login`: with `?token=` (the printed login URL) logs in and redirects to `next` (a
/// URL without the token); without, the form.
pub async fn login_form(State(st): State<Arc<AppState>>, Query(q): Query<LoginQuery>) -> Response {
    let next = local_next(q.next.as_deref());
    match q.token.as_deref() {
        Some(t) => log_in(&st.auth, t, &next),
        None => (
            [(header::CACHE_CONTROL, "no-store")],
            login_page(st.auth.source, &next, None),
        )
            .into_response(),
    }
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
    log_in(&st.auth, &f.token, &local_next(f.next.as_deref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `next` that a browser could read as another host, or that cannot go into a header,
    /// goes to `/`: tabs and newlines (which browsers drop from a `Location`), any other
    /// control byte, space, DEL, a backslash, `//`, a scheme.
    #[test]
    fn next_is_a_local_path_only() {
        for evil in [
            "/\t/evil.example",
            "/\n/evil.example",
            "/\r/evil.example",
            "/a\nSet-Cookie: x=y",
            "/\u{0}/x",
            "/ /evil.example",
            "/\u{7f}/evil.example",
            "/\\evil.example",
            "//evil.example",
            "https://evil.example",
            "evil.example",
            "",
        ] {
            assert_eq!(local_next(Some(evil)), "/", "{evil:?}");
        }
        assert_eq!(local_next(None), "/");
        assert_eq!(local_next(Some("/projects/p/runs")), "/projects/p/runs");
    }

    /// `--token-file`: a file group or others may use in any way, a file of another user, a
    /// symlink and a directory are refused, naming the file and the fix; the checks are the
    /// read descriptor's.
    #[test]
    fn token_file_checks() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("token");
        std::fs::write(&f, "s3cret-token-0123456789\n").unwrap();
        let chmod = |m: u32| {
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(m)).unwrap();
        };
        chmod(0o600);
        assert_eq!(read_token(&f).unwrap(), "s3cret-token-0123456789");
        chmod(0o400);
        assert!(read_token(&f).is_ok());
        for m in [0o602, 0o640, 0o604, 0o610, 0o601, 0o620] {
            chmod(m);
            let e = read_token(&f).unwrap_err().to_string();
            assert!(
                e.contains(&format!("mode {m:03o}")) && e.contains("chmod 600"),
                "{m:o}: {e}"
            );
        }
        chmod(0o600);
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        let e = read_token(&link).unwrap_err().to_string();
        assert!(e.contains("a symlink") && e.contains("link"), "{e}");
        let e = read_token(d.path()).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        let e = read_token(&d.path().join("missing"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing"), "{e}");
        // Another user's file, even 0600: root could read it, but that user can change it.
        if rustix::process::geteuid().is_root() {
            std::os::unix::fs::chown(&f, Some(65534), None).unwrap();
            let e = read_token(&f).unwrap_err().to_string();
            assert!(e.contains("belongs to uid 65534"), "{e}");
        } else {
            eprintln!("skipped the other-owner case: needs root");
        }
    }

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
        assert_eq!(
            local_next(Some("/projects/a?limit=3")),
            "/projects/a?limit=3"
        );
        // The cookie holds the session secret, never the token; the header holds the token.
        let auth = Auth::new("secret-token-0123".into(), TokenSource::File, 7878).unwrap();
        assert_eq!(auth.cookie_name(), "layercache_session_7878");
        assert_eq!(auth.session.len(), 64);
        let mut h = HeaderMap::new();
        let with = |h: &mut HeaderMap, name: &'static str, v: &str| {
            h.insert(name, v.parse().unwrap());
        };
        assert!(!auth.allows(&h));
        with(
            &mut h,
            "cookie",
            &format!("a=b; layercache_session_7878={}", auth.session),
        );
        assert!(auth.allows(&h));
        with(
            &mut h,
            "cookie",
            &format!("layercache_session_7879={}", auth.session),
        );
        assert!(!auth.allows(&h), "another port's cookie");
        with(
            &mut h,
            "cookie",
            "layercache_session_7878=secret-token-0123",
        );
        assert!(!auth.allows(&h), "the token as a cookie");
        let mut h = HeaderMap::new();
        with(&mut h, "authorization", "Bearer secret-token-0123");
        assert!(auth.allows(&h));
        with(&mut h, "authorization", "Bearer secret-token-0124");
        assert!(!auth.allows(&h));
        with(&mut h, "authorization", "Basic secret-token-0123");
        assert!(!auth.allows(&h));
        assert!(!format!("{auth:?}").contains("secret-token"));
        assert!(
            same_secret("abc", "abc") && !same_secret("abc", "abd") && !same_secret("ab", "abc")
        );
        assert_eq!(
            super::super::pages::urlencode("/a b?x=1"),
            "%2Fa%20b%3Fx%3D1"
        );
    }
}
