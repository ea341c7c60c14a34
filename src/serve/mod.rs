//! `layercache serve`: a JSON API (`/api/v1`, documented at `/api/v1/openapi.json`) and
//! server-rendered pages over the store, in one process (axum on tokio) that serves until
//! SIGINT or SIGTERM and then finishes the requests in flight.
//!
//! There is no second database: every answer is computed from the store and the event log by
//! the functions the CLI uses (`view`). Its modules are private; this one is the front door
//! ([`Config`], [`router`], [`serve`]). Inside: `api` (JSON handlers), `pages` (HTML), `auth`
//! (token, login cookie, same-origin and Host checks), `token` (the store's own token file),
//! `errors` (the one `AppError`), `specs` (spec validation with field and line; the stored specs
//! are the store's), `runs` (history and the chart), `openapi` (the document and its route
//! table).
//!
//! Security: every request but the login form needs a token — `--token-file`'s, or the store's
//! own (`<store>/v1/serve-token`, mode 0600, made on the first start and printed in a login URL),
//! so on a shared host only the store's owner and root get in; loopback only unless
//! `--token-file` is given ([`Config::new`] refuses any other address without one), and on
//! loopback both families' loopback ports are this server's (nobody else can listen where a
//! client's `localhost` lands and receive its token); ids are
//! validated by [`crate::ids`]; bodies are limited to [`MAX_BODY`] bytes; the only files read or
//! written are the store's.

#![forbid(unsafe_code)]

mod api;
mod auth;
mod errors;
mod openapi;
mod pages;
mod runs;
mod token;
mod validation;
mod view;

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderName, HeaderValue, header};
use axum::routing::{delete, get};
use tower_http::set_header::SetResponseHeaderLayer;

use crate::error::{Error, Result};
use crate::store::Store;

/// The largest request body accepted, bytes (413 beyond).
pub const MAX_BODY: usize = 1024 * 1024;

/// What every handler shares.
#[derive(Debug)]
pub struct AppState {
    /// The store (the same one the CLI opens).
    pub store: Store,
    /// Who may use it: the token every request must carry and the login cookie.
    pub auth: auth::Auth,
}

/// The validated configuration of `layercache serve`.
#[derive(Debug)]
pub struct Config {
    /// Where to listen.
    pub listen: SocketAddr,
    /// The token from `--token-file` (`None`: the store's own, `<root>/v1/serve-token`).
    pub token: Option<String>,
    /// `--token-file`, as given.
    pub token_file: Option<PathBuf>,
}

impl Config {
    /// Validates `--listen` and `--token-file`.
    ///
    /// Errors: [`Error::Invalid`] (exit 2) for an address that is not `IP:PORT`, an unreadable
    /// or weak token file (see `auth::read_token`), or a non-loopback address without a
    /// token.
    pub fn new(listen: &str, token_file: Option<&std::path::Path>) -> Result<Config> {
        let addr: SocketAddr = listen.parse().map_err(|_| {
            Error::invalid(format!(
                "--listen {listen:?}: want IP:PORT, e.g. 127.0.0.1:7878 or [::1]:7878"
            ))
        })?;
        let token = token_file.map(auth::read_token).transpose()?;
        if !addr.ip().is_loopback() && token.is_none() {
            return Err(Error::invalid(format!(
                "--listen {addr}: not a loopback address; listening there needs --token-file \
                 FILE (every request must then carry the token)"
            )));
        }
        Ok(Config {
            listen: addr,
            token,
            token_file: token_file.map(Path::to_path_buf),
        })
    }
}

/// The router: API, pages, the auth middleware, the body limit, request tracing.
pub fn router(state: Arc<AppState>) -> Router {
    let router = Router::new()
        .route("/api/v1/openapi.json", get(openapi::serve))
        .route("/api/v1/projects", get(api::projects))
        .route(
            "/api/v1/projects/{project}/caches",
            get(api::caches).delete(api::clear_project),
        )
        .route(
            "/api/v1/projects/{project}/caches/{cache}",
            delete(api::clear_cache),
        )
        .route(
            "/api/v1/projects/{project}/caches/{cache}/keys/{key}",
            delete(api::clear_key),
        )
        .route("/api/v1/projects/{project}/runs", get(api::runs))
        .route("/api/v1/projects/{project}/runs/{run}", get(api::run))
        .route("/api/v1/projects/{project}/stats", get(api::stats))
        .route(
            "/api/v1/projects/{project}/spec",
            get(api::get_spec).put(api::put_spec),
        )
        .route("/api/v1/specs/validate", axum::routing::post(api::validate))
        .route("/api/v1/gc", axum::routing::post(api::gc))
        .route("/", get(pages::projects))
        .route("/projects/{project}", get(pages::project))
        .route(
            "/projects/{project}/clear",
            get(pages::clear_confirm).post(pages::clear),
        )
        .route("/projects/{project}/runs", get(pages::runs))
        .route("/projects/{project}/runs/{run}", get(pages::run))
        .route(
            "/projects/{project}/spec",
            get(pages::spec).post(pages::spec_post),
        )
        .route("/login", get(auth::login_form).post(auth::login))
        .route("/api/{*rest}", axum::routing::any(api_not_found))
        .fallback(pages::not_found)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::guard,
        ))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(tower_http::limit::RequestBodyLimitLayer::new(MAX_BODY))
        .layer(
            tower_http::trace::TraceLayer::new_for_http()
                .make_span_with(request_span)
                .on_response(
                    tower_http::trace::DefaultOnResponse::new().level(tracing::Level::INFO),
                ),
        );
    let router = SECURITY_HEADERS
        .into_iter()
        .fold(router, |r, (name, value)| {
            r.layer(SetResponseHeaderLayer::if_not_present(
                name,
                HeaderValue::from_static(value),
            ))
        });
    router.with_state(state)
}

/// Response headers every answer carries unless a handler set them: a Content-Security-Policy
/// that allows only the page's own inline stylesheet and forms posting back to this server (no
/// scripts, no frames, no outside fetches), `X-Frame-Options: DENY` for older browsers,
/// `X-Content-Type-Options: nosniff` and `Referrer-Policy: no-referrer` (OWASP secure headers).
const SECURITY_HEADERS: [(HeaderName, &str); 4] = [
    (
        header::CONTENT_SECURITY_POLICY,
        "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; \
         frame-ancestors 'none'; base-uri 'none'",
    ),
    (header::X_FRAME_OPTIONS, "DENY"),
    (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    (header::REFERRER_POLICY, "no-referrer"),
];

async fn api_not_found(uri: axum::http::Uri) -> errors::AppError {
    errors::AppError::NotFound {
        what: format!("route {}", uri.path()),
        exists: openapi::ROUTES.iter().map(|o| o.path.to_string()).collect(),
    }
}

/// The span of a request in the log: method and URI, but never the query of `/login` (the
/// login URL holds the token).
fn request_span(req: &axum::http::Request<axum::body::Body>) -> tracing::Span {
    let uri = req.uri();
    let shown = match uri.query() {
        Some(_) if uri.path() == "/login" => "/login?…".to_string(),
        _ => uri.to_string(),
    };
    tracing::info_span!("request", method = %req.method(), uri = %shown)
}

/// Waits for SIGINT or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; stop the server with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = int.recv() => tracing::info!("SIGINT: shutting down"),
    }
}

/// Serves `store` on `cfg.listen` until SIGINT/SIGTERM. Without `--token-file` it takes the
/// store's token (`<root>/v1/serve-token`, mode 0600, made on the first start). On a loopback address it
/// also listens on the other family's loopback with the same port (`[::1]:P` beside
/// `127.0.0.1:P` and the reverse; see `bind_other_loopback`), so no other local user can
/// listen there and receive the token of a client that resolved `localhost` to it. Once listening it prints on
/// stdout `layercache: serving STORE on http://ADDR/` (the bound address: port 0 picks one)
/// and a line with the login URL (`http://ADDR/login?token=TOKEN` for the store's token; the
/// form `http://ADDR/login` for `--token-file`'s, which is never printed); with `json`, one
/// line `{"listen": "http://ADDR/", "login": URL, "token_file": PATH}`.
///
/// Errors: [`Error::Invalid`] when the store's token file or its directory is unsafe (see
/// `token::load_or_create`); [`Error::Io`] when the token cannot be read or made or the
/// address cannot be bound; [`Error::Failed`] when the runtime cannot start, or the other
/// loopback's port is held by another process.
pub fn serve(store: Store, cfg: Config, json: bool) -> Result<i32> {
    let (token, source, token_file) = match (cfg.token, cfg.token_file) {
        (Some(t), Some(f)) => (t, auth::TokenSource::File, f),
        _ => (
            token::load_or_create(store.root())?,
            auth::TokenSource::Store,
            token::path(store.root()),
        ),
    };
    // Root serving a user's store (allowed: the store is theirs) says so, never silently.
    if source == auth::TokenSource::Store
        && rustix::process::geteuid().is_root()
        && let Ok(m) = std::fs::symlink_metadata(&token_file)
        && std::os::unix::fs::MetadataExt::uid(&m) != 0
    {
        eprintln!(
            "layercache: the store belongs to uid {0}, so its token file {1} is theirs: uid {0} \
             can use this server (running as root) on this store; stored specs saved here are \
             theirs too, and root's `run --project` will not run them",
            std::os::unix::fs::MetadataExt::uid(&m),
            token_file.display()
        );
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::Failed(format!("cannot start the async runtime: {e}")))?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(cfg.listen)
            .await
            .map_err(|e| Error::io(PathBuf::from(format!("--listen {}", cfg.listen)), e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::io(PathBuf::from(format!("--listen {}", cfg.listen)), e))?;
        let twin = bind_other_loopback(addr).await?;
        let auth = auth::Auth::new(token, source, addr.port())?;
        let url = format!("http://{addr}/");
        let login = format!("http://{addr}{}", auth.login_path());
        if json {
            println!(
                "{}",
                serde_json::json!({ "listen": url, "login": login, "token_file": token_file })
            );
        } else {
            println!("layercache: serving {} on {url}", store.root().display());
            match source {
                auth::TokenSource::Store => println!(
                    "layercache: log in at {login} (the token is kept in {}, readable by the \
                     store's owner; remove that file and restart to change it)",
                    token_file.display()
                ),
                auth::TokenSource::File => println!(
                    "layercache: every request needs the token of {} (Authorization: Bearer, \
                     or log in at {login})",
                    token_file.display()
                ),
            }
        }
        let _ = std::io::Write::flush(&mut std::io::stdout());
        let state = Arc::new(AppState { store, auth });
        // One signal stops both listeners; each finishes its requests in flight.
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            shutdown_signal().await;
            let _ = stop_tx.send(true);
        });
        let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|stop| *stop).await;
        };
        let main = axum::serve(listener, router(state.clone()))
            .with_graceful_shutdown(stopped(stop_rx.clone()))
            .into_future();
        let other = async {
            match twin {
                Some(l) => {
                    axum::serve(l, router(state))
                        .with_graceful_shutdown(stopped(stop_rx))
                        .await
                }
                None => Ok(()),
            }
        };
        tokio::try_join!(main, other).map_err(|e| Error::Failed(format!("server: {e}")))?;
        Ok(0)
    })
}

/// The loopback address of the other family with the same port: `[::1]:P` for `127.x.y.z:P`,
/// `127.0.0.1:P` for `[::1]:P`; `None` for an address that is not loopback.
fn other_loopback(addr: SocketAddr) -> Option<SocketAddr> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    if !addr.ip().is_loopback() {
        return None;
    }
    let ip = match addr.ip() {
        IpAddr::V4(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
        IpAddr::V6(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
    };
    Some(SocketAddr::new(ip, addr.port()))
}

/// Listening on a loopback address, also takes the other family's loopback on the port that
/// the first bind got ([`other_loopback`]): a client resolving `localhost` may try `::1` before
/// `127.0.0.1` (or the reverse), and whoever listened there instead would receive its
/// `Authorization: Bearer` token. `None` when `addr` is not loopback or the host has no such
/// address (IPv6 disabled: `EADDRNOTAVAIL`, `EAFNOSUPPORT`).
///
/// Errors: [`Error::Failed`] naming the address when another process already listens there
/// (`EADDRINUSE`) or it cannot be bound otherwise — the server then does not start.
async fn bind_other_loopback(addr: SocketAddr) -> Result<Option<tokio::net::TcpListener>> {
    let Some(other) = other_loopback(addr) else {
        return Ok(None);
    };
    match tokio::net::TcpListener::bind(other).await {
        Ok(l) => Ok(Some(l)),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EADDRNOTAVAIL | libc::EAFNOSUPPORT)
            ) =>
        {
            tracing::info!("{other} not bound ({e}): this host has no such loopback address");
            Ok(None)
        }
        Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) => Err(Error::Failed(format!(
            "{other} is already in use by another process: clients that resolve localhost \
             there would send it the token, so serve does not start on {addr}; stop what \
             listens on {other} (`ss -ltnp`) or pick another port with --listen"
        ))),
        Err(e) => Err(Error::Failed(format!(
            "cannot bind {other} (the other loopback of {addr}, bound so that nobody else can \
             take it): {e}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use tower::ServiceExt;

    /// The token of the test servers.
    const TOKEN: &str = "0123456789abcdef0123456789abcdef";

    fn state_with(source: auth::TokenSource) -> (tempfile::TempDir, Arc<AppState>) {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open(Some(d.path())).unwrap();
        store
            .project(&crate::ids::ProjectId::new("p").unwrap())
            .unwrap();
        let auth = auth::Auth::new(TOKEN.into(), source, 7878).unwrap();
        (d, Arc::new(AppState { store, auth }))
    }

    fn state() -> (tempfile::TempDir, Arc<AppState>) {
        state_with(auth::TokenSource::Store)
    }

    async fn send_raw(
        st: &Arc<AppState>,
        req: Request<Body>,
    ) -> (axum::http::Response<Body>, String) {
        let resp = router(st.clone()).oneshot(req).await.unwrap();
        let (parts, body) = resp.into_parts();
        let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
        (
            axum::http::Response::from_parts(parts, Body::empty()),
            String::from_utf8_lossy(&bytes).into_owned(),
        )
    }

    async fn send(st: &Arc<AppState>, req: Request<Body>) -> (StatusCode, serde_json::Value) {
        let (resp, text) = send_raw(st, req).await;
        (
            resp.status(),
            serde_json::from_str(&text).unwrap_or_default(),
        )
    }

    /// A request without credentials.
    fn anon(method: &str, uri: &str) -> axum::http::request::Builder {
        Request::builder()
            .method(method)
            .uri(uri)
            .header("host", "127.0.0.1:7878")
    }

    /// A request with the token.
    fn req(method: &str, uri: &str) -> axum::http::request::Builder {
        anon(method, uri).header("authorization", format!("Bearer {TOKEN}"))
    }

    /// Every route the server has: the API's (from the OpenAPI table), the pages (GET and the
    /// form posts) and unknown paths, with ids filled in.
    fn all_routes() -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = openapi::ROUTES
            .iter()
            .map(|op| {
                let uri = op
                    .path
                    .replace("{project}", "p")
                    .replace("{cache}", "c")
                    .replace("{key}", "k")
                    .replace("{run}", "000000000000-000000000000");
                (op.method.to_uppercase(), uri)
            })
            .collect();
        for (m, u) in [
            ("GET", "/"),
            ("GET", "/projects/p"),
            ("GET", "/projects/p/clear"),
            ("POST", "/projects/p/clear"),
            ("GET", "/projects/p/runs"),
            ("GET", "/projects/p/runs/000000000000-000000000000"),
            ("GET", "/projects/p/spec"),
            ("POST", "/projects/p/spec"),
            ("GET", "/api/v1/nope"),
            ("HEAD", "/api/v1/projects"),
            ("GET", "/nope"),
        ] {
            out.push((m.into(), u.into()));
        }
        out
    }

    /// Every operation the OpenAPI document lists reaches a handler (not the API's fallback,
    /// not 405), and the document lists every `/api/v1` route the router has.
    #[tokio::test]
    async fn every_documented_route_exists() {
        let (_d, st) = state();
        for op in openapi::ROUTES {
            let uri = op
                .path
                .replace("{project}", "p")
                .replace("{cache}", "c")
                .replace("{key}", "k");
            let (status, body) = send(
                &st,
                req(&op.method.to_uppercase(), &uri)
                    .header("content-type", "application/json")
                    .body(Body::from("{}"))
                    .unwrap(),
            )
            .await;
            assert_ne!(
                status,
                StatusCode::METHOD_NOT_ALLOWED,
                "{} {uri}",
                op.method
            );
            let text = body["error"].as_str().unwrap_or("");
            assert!(!text.starts_with("route "), "{} {uri}: {body}", op.method);
        }
        let doc = openapi::document("layercache_session_7878");
        // Every operation needs the token: no anonymous `{}` alternative, no operation that
        // overrides the top-level requirement.
        assert_eq!(
            doc["security"],
            serde_json::json!([{"bearer": []}, {"cookie": []}])
        );
        assert_eq!(
            doc["components"]["securitySchemes"]["cookie"]["name"],
            "layercache_session_7878"
        );
        for (path, ops) in doc["paths"].as_object().unwrap() {
            for (method, op) in ops.as_object().unwrap() {
                assert!(op.get("security").is_none(), "{method} {path}");
                assert!(op["responses"]["401"].is_object(), "{method} {path}");
            }
        }
        assert_eq!(
            doc["paths"].as_object().unwrap().len(),
            openapi::ROUTES
                .iter()
                .map(|o| o.path)
                .collect::<std::collections::BTreeSet<_>>()
                .len()
        );
        let (status, body) =
            send(&st, req("GET", "/api/v1/nope").body(Body::empty()).unwrap()).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(
            body["error"].as_str().unwrap().starts_with("route "),
            "{body}"
        );
    }

    #[tokio::test]
    async fn ids_not_found_tokens_origins() {
        let (_d, st) = state();
        let (s, b) = send(
            &st,
            req("GET", "/api/v1/projects/a%2F..%2Fb/caches")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{b}");
        assert!(b["error"].as_str().unwrap().contains("project id"), "{b}");
        let (s, b) = send(
            &st,
            req("GET", "/api/v1/projects/q/caches")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(s, StatusCode::NOT_FOUND);
        assert_eq!(b["exists"], serde_json::json!(["p"]));
        let (s, _) = send(
            &st,
            req("DELETE", "/api/v1/projects/p/caches")
                .header("origin", "http://evil.example")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(s, StatusCode::FORBIDDEN);
        // A rebound name meets the Host check even with the token (the store's token).
        let (s, _) = send(
            &st,
            Request::builder()
                .uri("/api/v1/projects")
                .header("host", "rebound.example:7878")
                .header("authorization", format!("Bearer {TOKEN}"))
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(s, StatusCode::FORBIDDEN);
        // --token-file's token may be served behind a proxy under another name.
        let (_d2, st) = state_with(auth::TokenSource::File);
        let (s, b) = send(
            &st,
            Request::builder()
                .uri("/api/v1/projects")
                .header("host", "cache.example.org")
                .header("authorization", format!("Bearer {TOKEN}"))
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{b}");
        let big = vec![b'#'; MAX_BODY + 1];
        let (s, _) = send(
            &st,
            req("POST", "/api/v1/specs/validate")
                .body(Body::from(big))
                .unwrap(),
        )
        .await;
        assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
    }

    /// Without the token (none, a wrong one, the token in the cookie, an old session's
    /// cookie) every route answers 401 — the API as JSON, pages with the login form — and
    /// nothing is stored or removed; only the login form is open.
    #[tokio::test]
    async fn every_route_needs_the_token() {
        let (d, st) = state();
        let bad_creds: [(&str, String); 5] = [
            ("x-none", String::new()),
            ("authorization", format!("Bearer {TOKEN}0")),
            ("authorization", TOKEN.to_string()),
            ("cookie", format!("layercache_session_7878={TOKEN}")),
            (
                "cookie",
                format!("layercache_session_7878={}", "0".repeat(64)),
            ),
        ];
        for (method, uri) in all_routes() {
            for (name, value) in &bad_creds {
                let body = if uri.ends_with("/spec") {
                    Body::from("project = \"p\"\n")
                } else {
                    Body::from("{}")
                };
                let (resp, text) = send_raw(
                    &st,
                    anon(&method, &uri)
                        .header(*name, value.as_str())
                        .header("content-type", "application/toml")
                        .body(body)
                        .unwrap(),
                )
                .await;
                assert_eq!(
                    resp.status(),
                    StatusCode::UNAUTHORIZED,
                    "{method} {uri} with {name}: {text}"
                );
                assert!(
                    resp.headers()
                        .get("www-authenticate")
                        .is_some_and(|v| v.to_str().unwrap().starts_with("Bearer")),
                    "{method} {uri}"
                );
                if method != "HEAD" && !uri.starts_with("/api/") {
                    assert!(text.contains("action=\"/login\""), "{method} {uri}: {text}");
                }
                assert!(!text.contains(TOKEN), "{method} {uri}: {text}");
            }
        }
        // Nothing was stored or removed.
        let pd = st.store.projects(None).unwrap();
        assert_eq!(pd.len(), 1);
        assert!(pd[0].current_spec().unwrap().is_none());
        assert!(d.path().join("v1/projects/p").is_dir());
        // The login form is open; a page posted without the token returns there after login.
        let (resp, text) = send_raw(&st, anon("GET", "/login").body(Body::empty()).unwrap()).await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(text.contains("action=\"/login\""), "{text}");
        let (resp, text) = send_raw(
            &st,
            anon("GET", "/projects/p/runs?limit=3")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
        assert!(
            text.contains("value=\"/projects/p/runs?limit=3\""),
            "the form returns to the page: {text}"
        );
    }

    /// The login URL sets the cookie (the session secret, not the token; HttpOnly,
    /// SameSite=Strict, Path=/) and redirects to a URL without the token; the cookie then opens
    /// the pages and the API; a wrong token gets the form again and no cookie.
    #[tokio::test]
    async fn login_url_sets_the_cookie_and_drops_the_token() {
        let (_d, st) = state();
        assert_eq!(st.auth.login_path(), format!("/login?token={TOKEN}"));
        let (resp, _) = send_raw(
            &st,
            anon("GET", &format!("/login?token={TOKEN}&next=%2Fprojects%2Fp"))
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(resp.status(), StatusCode::SEE_OTHER);
        let h = |name: &str| {
            resp.headers()
                .get(name)
                .map(|v| v.to_str().unwrap().to_string())
                .unwrap_or_default()
        };
        assert_eq!(h("location"), "/projects/p");
        assert_eq!(h("cache-control"), "no-store");
        assert_eq!(h("referrer-policy"), "no-referrer");
        let set = h("set-cookie");
        let (pair, attrs) = set.split_once(';').unwrap();
        let (name, value) = pair.split_once('=').unwrap();
        assert_eq!(name, "layercache_session_7878");
        assert_ne!(value, TOKEN);
        assert_eq!(value.len(), 64);
        for a in ["Path=/", "HttpOnly", "SameSite=Strict"] {
            assert!(attrs.split(';').any(|x| x.trim() == a), "{set}");
        }
        for uri in ["/projects/p", "/api/v1/projects", "/api/v1/openapi.json"] {
            let (s, _) = send(
                &st,
                anon("GET", uri)
                    .header("cookie", pair)
                    .body(Body::empty())
                    .unwrap(),
            )
            .await;
            assert_eq!(s, StatusCode::OK, "{uri}");
        }
        // A state-changing call with the cookie from this server's page passes too.
        let (s, b) = send(
            &st,
            anon("POST", "/api/v1/gc")
                .header("cookie", pair)
                .header("origin", "http://127.0.0.1:7878")
                .body(Body::from("{\"dry_run\": true}"))
                .unwrap(),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{b}");
        // Without ?next= it goes to the projects; a foreign next is not followed.
        // A tab (which browsers drop, reading `//evil.example`) or a newline (which cannot go
        // into a header: it was a 500) is not followed either.
        for (q, to) in [
            ("", "/"),
            ("&next=%2F%2Fevil.example", "/"),
            ("&next=/%09/evil.example", "/"),
            ("&next=/a%0Ab", "/"),
        ] {
            let (resp, _) = send_raw(
                &st,
                anon("GET", &format!("/login?token={TOKEN}{q}"))
                    .body(Body::empty())
                    .unwrap(),
            )
            .await;
            assert_eq!(resp.headers()["location"], to, "{q}");
        }
        let (resp, text) = send_raw(
            &st,
            anon("GET", "/login?token=0123456789abcdef0123456789abcdeX")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
        assert!(resp.headers().get("set-cookie").is_none());
        assert!(text.contains("Wrong token."), "{text}");
        // The form post logs in the same way.
        let (resp, _) = send_raw(
            &st,
            anon("POST", "/login")
                .header("content-type", "application/x-www-form-urlencoded")
                .body(Body::from(format!("token={TOKEN}&next=%2Fprojects%2Fp")))
                .unwrap(),
        )
        .await;
        assert_eq!(resp.status(), StatusCode::SEE_OTHER);
        assert_eq!(resp.headers()["location"], "/projects/p");
        assert!(
            resp.headers()["set-cookie"]
                .to_str()
                .unwrap()
                .starts_with(pair)
        );
    }

    #[test]
    fn listen_rules() {
        assert!(Config::new("127.0.0.1:0", None).is_ok());
        let e = Config::new("0.0.0.0:7878", None).unwrap_err().to_string();
        assert!(e.contains("--token-file"), "{e}");
        assert!(Config::new("localhost", None).is_err());
        let other = |a: &str| other_loopback(a.parse().unwrap()).map(|a| a.to_string());
        assert_eq!(other("127.0.0.1:7878").as_deref(), Some("[::1]:7878"));
        assert_eq!(other("127.0.0.2:80").as_deref(), Some("[::1]:80"));
        assert_eq!(other("[::1]:7878").as_deref(), Some("127.0.0.1:7878"));
        assert_eq!(other("10.0.0.1:7878"), None);
        assert_eq!(other("[::]:7878"), None);
    }
}
