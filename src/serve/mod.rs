//! `layercache serve`: a JSON API (`/api/v1`, documented at `/api/v1/openapi.json`) and
//! server-rendered pages over the store, in one process (axum on tokio) that serves until
//! SIGINT or SIGTERM and then finishes the requests in flight.
//!
//! There is no second database: every answer is computed from the store and the event log by
//! the functions the CLI uses (`view`). Its modules are private; this one is the front door
//! ([`Config`], [`router`], [`serve`]). Inside: `api` (JSON handlers), `pages` (HTML), `auth`
//! (token, login cookie, same-origin and Host checks), `errors` (the one `AppError`), `specs`
//! (spec validation with field and line; the stored specs are the store's), `runs` (history and
//! the chart), `openapi` (the document and its route table).
//!
//! Security: loopback only unless `--token-file` is given ([`Config::new`] refuses any other
//! address without one); ids are validated by [`crate::ids`]; bodies are limited to
//! [`MAX_BODY`] bytes; the only files read or written are the store's.

mod api;
mod auth;
mod errors;
mod openapi;
mod pages;
mod runs;
mod specs;
mod view;

use std::net::SocketAddr;
use std::path::PathBuf;
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
    /// The token every request must carry, when one was given.
    pub token: Option<String>,
}

/// The validated configuration of `layercache serve`.
#[derive(Debug)]
pub struct Config {
    /// Where to listen.
    pub listen: SocketAddr,
    /// The token, from `--token-file`.
    pub token: Option<String>,
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
                .make_span_with(
                    tower_http::trace::DefaultMakeSpan::new().level(tracing::Level::INFO),
                )
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

/// Serves `store` on `cfg.listen` until SIGINT/SIGTERM; prints
/// `layercache: serving STORE on http://ADDR/` (the bound address: port 0 picks one) on
/// stdout once listening, or `{"listen": "http://ADDR/"}` with `json`.
///
/// Errors: [`Error::Io`] when the address cannot be bound; [`Error::Failed`] when the runtime
/// cannot start.
pub fn serve(store: Store, cfg: Config, json: bool) -> Result<i32> {
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
        let url = format!("http://{addr}/");
        if json {
            println!("{}", serde_json::json!({ "listen": url }));
        } else {
            println!("layercache: serving {} on {url}", store.root().display());
        }
        let _ = std::io::Write::flush(&mut std::io::stdout());
        let state = Arc::new(AppState {
            store,
            token: cfg.token,
        });
        axum::serve(listener, router(state))
            .with_graceful_shutdown(shutdown_signal())
            .await
            .map_err(|e| Error::Failed(format!("server: {e}")))?;
        Ok(0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use tower::ServiceExt;

    fn state(token: Option<&str>) -> (tempfile::TempDir, Arc<AppState>) {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open(Some(d.path())).unwrap();
        store
            .project(&crate::ids::ProjectId::new("p").unwrap())
            .unwrap();
        let st = Arc::new(AppState {
            store,
            token: token.map(String::from),
        });
        (d, st)
    }

    async fn send(st: &Arc<AppState>, req: Request<Body>) -> (StatusCode, serde_json::Value) {
        let resp = router(st.clone()).oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, serde_json::from_slice(&bytes).unwrap_or_default())
    }

    fn req(method: &str, uri: &str) -> axum::http::request::Builder {
        Request::builder()
            .method(method)
            .uri(uri)
            .header("host", "127.0.0.1:7878")
    }

    /// Every operation the OpenAPI document lists reaches a handler (not the API's fallback,
    /// not 405), and the document lists every `/api/v1` route the router has.
    #[tokio::test]
    async fn every_documented_route_exists() {
        let (_d, st) = state(None);
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
        let doc = openapi::document();
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
        let (_d, st) = state(None);
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
        let (s, _) = send(
            &st,
            Request::builder()
                .uri("/api/v1/projects")
                .header("host", "rebound.example:7878")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(s, StatusCode::FORBIDDEN);
        let (_d2, st) = state(Some("0123456789abcdef"));
        let (s, _) = send(
            &st,
            req("GET", "/api/v1/projects").body(Body::empty()).unwrap(),
        )
        .await;
        assert_eq!(s, StatusCode::UNAUTHORIZED);
        let (s, b) = send(
            &st,
            req("GET", "/api/v1/projects")
                .header("authorization", "Bearer 0123456789abcdef")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{b}");
        let big = vec![b'#'; MAX_BODY + 1];
        let (s, _) = send(
            &st,
            req("POST", "/api/v1/specs/validate")
                .header("authorization", "Bearer 0123456789abcdef")
                .body(Body::from(big))
                .unwrap(),
        )
        .await;
        assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
    }

    #[test]
    fn listen_rules() {
        assert!(Config::new("127.0.0.1:0", None).is_ok());
        let e = Config::new("0.0.0.0:7878", None).unwrap_err().to_string();
        assert!(e.contains("--token-file"), "{e}");
        assert!(Config::new("localhost", None).is_err());
    }
}
