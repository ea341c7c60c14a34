//! The JSON API under `/api/v1` (documented in [`super::openapi`]). Each handler validates its
//! ids like the CLI does, then calls the store and telemetry functions the CLI calls.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::AppState;
use super::errors::{AppError, FieldError};
use super::validation;
use super::view::{self, ClearTarget, blocking};
use crate::spec::Spec;
use crate::store::GcOptions;
use crate::units;

/// Default and largest `limit` of `GET …/runs`.
pub const RUNS_DEFAULT: usize = 100;
/// The largest `limit` of `GET …/runs`.
pub const RUNS_MAX: usize = 10_000;

/// `GET /api/v1/projects`.
pub async fn projects(State(st): State<Arc<AppState>>) -> Result<Json<Value>, AppError> {
    let rows = blocking(move || view::projects(&st.store)).await?;
    Ok(Json(json!(rows)))
}

/// `GET /api/v1/projects/{project}/caches`.
pub async fn caches(
    State(st): State<Arc<AppState>>,
    Path(project): Path<String>,
) -> Result<Json<Value>, AppError> {
    let rows = view::project_caches(st, view::project_id(&project)?).await?;
    Ok(Json(json!(rows)))
}

async fn clear(
    st: Arc<AppState>,
    project: &str,
    target: ClearTarget,
) -> Result<Json<Value>, AppError> {
    let p = view::project_id(project)?;
    let report = blocking(move || {
        let pd = view::require_project(&st.store, &p)?;
        view::clear(&st.store, &pd, &target)
    })
    .await?;
    Ok(Json(json!(report)))
}

/// `DELETE /api/v1/projects/{project}/caches`: every layer of the project.
pub async fn clear_project(
    State(st): State<Arc<AppState>>,
    Path(project): Path<String>,
) -> Result<Json<Value>, AppError> {
    clear(st, &project, ClearTarget::Project).await
}

/// `DELETE /api/v1/projects/{project}/caches/{cache}`.
pub async fn clear_cache(
    State(st): State<Arc<AppState>>,
    Path((project, cache)): Path<(String, String)>,
) -> Result<Json<Value>, AppError> {
    let c = view::cache_id(&cache)?;
    clear(st, &project, ClearTarget::Cache(c)).await
}

/// `DELETE /api/v1/projects/{project}/caches/{cache}/keys/{key}`.
pub async fn clear_key(
    State(st): State<Arc<AppState>>,
    Path((project, cache, key)): Path<(String, String, String)>,
) -> Result<Json<Value>, AppError> {
    let c = view::cache_id(&cache)?;
    let k = view::cache_key(&key)?;
    clear(st, &project, ClearTarget::Key(c, k)).await
}

/// The `?limit=N` of `GET …/runs`.
#[derive(Debug, Deserialize)]
pub struct RunsQuery {
    /// How many rows, newest first (default [`RUNS_DEFAULT`], at most [`RUNS_MAX`]).
    pub limit: Option<String>,
}

/// Parses `?limit=` (400 naming the value).
pub fn parse_limit(limit: Option<&str>) -> Result<usize, AppError> {
    match limit {
        None => Ok(RUNS_DEFAULT),
        Some(s) => match s.parse::<usize>() {
            Ok(n) if (1..=RUNS_MAX).contains(&n) => Ok(n),
            _ => Err(AppError::BadRequest(format!(
                "limit {s:?}: want a whole number from 1 to {RUNS_MAX}"
            ))),
        },
    }
}

/// `GET /api/v1/projects/{project}/runs?limit=N`: newest first.
pub async fn runs(
    State(st): State<Arc<AppState>>,
    Path(project): Path<String>,
    Query(q): Query<RunsQuery>,
) -> Result<Json<Value>, AppError> {
    let p = view::project_id(&project)?;
    let limit = parse_limit(q.limit.as_deref())?;
    let rows = blocking(move || {
        let events = view::known_project_events(&st.store, &p)?;
        Ok(super::runs::history(&events, p.as_str(), limit))
    })
    .await?;
    Ok(Json(json!(rows)))
}

/// `GET /api/v1/projects/{project}/runs/{run}`: one run's preparations and totals
/// ([`super::runs::RunDetail`]).
///
/// Errors: 404 for an unknown project or a run the project's event log does not have.
pub async fn run(
    State(st): State<Arc<AppState>>,
    Path((project, run)): Path<(String, String)>,
) -> Result<Json<Value>, AppError> {
    let p = view::project_id(&project)?;
    let detail = blocking(move || run_detail(&st, &p, &run)).await?;
    Ok(Json(json!(detail)))
}

/// The run `run` of `p` from the event log, for the API and the run's page.
///
/// Errors: 400 for a `run` that is no run id (12 hex digits, `-`, 12 hex digits); 404 naming
/// the run (and pointing at the project's runs) or the project.
pub fn run_detail(
    st: &AppState,
    p: &crate::ids::ProjectId,
    run: &str,
) -> Result<super::runs::RunDetail, AppError> {
    if !crate::telemetry::is_run_id(run) {
        return Err(AppError::BadId(format!(
            "run id {run:?}: want 12 hex digits, '-', 12 hex digits (as `layercache run --json` \
             prints it)"
        )));
    }
    let events = view::known_project_events(&st.store, p)?;
    super::runs::run_detail(&events, p.as_str(), run).ok_or_else(|| AppError::NotFound {
        what: format!("run {run:?} of project {p}"),
        exists: vec![format!("/api/v1/projects/{p}/runs")],
    })
}

/// `GET /api/v1/projects/{project}/stats`: what `layercache stats --project P --json` prints.
pub async fn stats(
    State(st): State<Arc<AppState>>,
    Path(project): Path<String>,
) -> Result<Json<Value>, AppError> {
    let p = view::project_id(&project)?;
    let stats = blocking(move || {
        let events = view::known_project_events(&st.store, &p)?;
        Ok(crate::telemetry::stats(&events, Some(p.as_str())))
    })
    .await?;
    Ok(Json(json!(stats)))
}

/// A spec body: TOML (`application/toml`, `text/plain`, `text/x-toml`) or JSON
/// (`application/json`); with no Content-Type the text decides (JSON when it starts with `{`).
///
/// Errors: 415 for another type; 422 (field `body`) for a body that is not UTF-8 or whose text
/// does not match its JSON type.
pub fn spec_body(headers: &HeaderMap, body: &Bytes) -> Result<String, AppError> {
    let ctype = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        });
    let json = match ctype.as_deref() {
        None | Some("") => None,
        Some("application/json") => Some(true),
        Some("application/toml" | "text/plain" | "text/x-toml" | "application/x-toml") => {
            Some(false)
        }
        Some(other) => {
            return Err(AppError::UnsupportedType(format!(
                "Content-Type {other}: send the spec as application/toml (or text/plain) or \
                 application/json"
            )));
        }
    };
    let body_err = |message: String| {
        AppError::Invalid(vec![FieldError {
            field: "body".into(),
            message,
            line: None,
        }])
    };
    let text = std::str::from_utf8(body)
        .map_err(|e| body_err(format!("the body is not UTF-8: {e}")))?
        .to_string();
    let looks_json = text.trim_start().starts_with('{');
    match json {
        Some(true) if !looks_json => Err(body_err(
            "Content-Type is application/json but the body is not a JSON object".into(),
        )),
        Some(false) if looks_json => Err(body_err(
            "the body is a JSON object but Content-Type says TOML: send application/json".into(),
        )),
        _ => Ok(text),
    }
}

/// One cache of a validated spec, as the validate and spec endpoints list it.
#[derive(Clone, Debug, Serialize)]
pub struct CacheSummary {
    /// The cache id.
    pub id: String,
    /// The key the project's last run computed for this cache (key files live in the
    /// project's workdir, which the server never reads); `None` before the first run.
    pub key: Option<String>,
    /// The spec's restore keys, or the default (the key up to its hash) when the last key is
    /// known.
    pub restore_keys: Vec<String>,
    /// The mountpoint template (`{workdir}` stays; `{mount_root}` is `/cache`, the default).
    pub mountpoint: String,
}

/// Summarises `spec`'s caches with the keys of the project's last runs.
pub fn summarize(spec: &Spec, events: &[crate::telemetry::Event]) -> Vec<CacheSummary> {
    spec.caches
        .iter()
        .map(|c| {
            let key = events
                .iter()
                .rev()
                .find(|e| e.project == spec.project.as_str() && e.cache == c.id.as_str())
                .map(|e| e.key.clone());
            let restore_keys = match (&c.restore_keys, &key) {
                (Some(list), _) => list.clone(),
                // `<id>-<os>-<arch>-<env8>-<hash>`: the default restore key drops the hash.
                (None, Some(k)) => k
                    .rfind('-')
                    .map(|i| vec![k[..=i].to_string()])
                    .unwrap_or_default(),
                (None, None) => Vec::new(),
            };
            let mountpoint = c
                .mountpoint
                .clone()
                .unwrap_or_else(|| format!("{{mount_root}}/{}", c.id))
                .replace("{mount_root}", "/cache");
            CacheSummary {
                id: c.id.to_string(),
                key,
                restore_keys,
                mountpoint,
            }
        })
        .collect()
}

/// `POST /api/v1/specs/validate`.
pub async fn validate(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Value>, AppError> {
    let text = spec_body(&headers, &body)?;
    let spec = validation::validate(&text)?;
    let events = blocking(move || Ok(crate::telemetry::read(st.store.root())?)).await?;
    Ok(Json(
        json!({"ok": true, "caches": summarize(&spec, &events)}),
    ))
}

/// Checks that a spec saved under `project` declares that project.
///
/// Errors: 422 on field `project`.
pub fn same_project(
    spec: &Spec,
    text: &str,
    project: &crate::ids::ProjectId,
) -> Result<(), AppError> {
    if &spec.project == project {
        return Ok(());
    }
    let mut e = validation::field_error(
        text,
        &format!(
            "project: the spec declares project {:?} but is saved under project {:?}",
            spec.project.as_str(),
            project.as_str()
        ),
    );
    e.field = "project".into();
    Err(AppError::Invalid(vec![e]))
}

/// `GET /api/v1/projects/{project}/spec`: the current stored spec.
pub async fn get_spec(
    State(st): State<Arc<AppState>>,
    Path(project): Path<String>,
) -> Result<Json<Value>, AppError> {
    let p = view::project_id(&project)?;
    let v = blocking(move || {
        let pd = view::require_project(&st.store, &p)?;
        let Some(stored) = pd.current_spec()? else {
            return Err(AppError::NotFound {
                what: format!("stored spec of project {p}"),
                exists: Vec::new(),
            });
        };
        let events = crate::telemetry::read(st.store.root())?;
        let caches = validation::validate(&stored.text)
            .map(|s| summarize(&s, &events))
            .unwrap_or_default();
        Ok(json!({
            "project": stored.project, "version": stored.version, "format": stored.format,
            "saved": view::iso_time(stored.saved_ms), "spec": stored.text,
            "versions": pd.spec_versions()?, "caches": caches,
        }))
    })
    .await?;
    Ok(Json(v))
}

/// `PUT /api/v1/projects/{project}/spec`: validates and saves a new version (the project is
/// created in the store if it has none yet).
pub async fn put_spec(
    State(st): State<Arc<AppState>>,
    Path(project): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Value>, AppError> {
    let p = view::project_id(&project)?;
    let text = spec_body(&headers, &body)?;
    let spec = validation::validate(&text)?;
    same_project(&spec, &text, &p)?;
    let v = blocking(move || {
        let pd = st.store.project(&p)?;
        let stored = pd.save_spec(&text)?;
        let events = crate::telemetry::read(st.store.root())?;
        Ok(json!({
            "ok": true, "project": stored.project, "version": stored.version,
            "format": stored.format, "saved": view::iso_time(stored.saved_ms),
            "caches": summarize(&spec, &events),
        }))
    })
    .await?;
    Ok(Json(v))
}

/// The body of `POST /api/v1/gc`: `layercache gc`'s options (all optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GcBody {
    /// Report only.
    #[serde(default)]
    pub dry_run: bool,
    /// Like `--max-size` (`10G`, `none`).
    pub max_size: Option<String>,
    /// Like `--max-inodes` (0: no limit).
    pub max_inodes: Option<u64>,
    /// Like `--max-age` (`30d`, `none`).
    pub max_age: Option<String>,
}

/// `POST /api/v1/gc`: what `layercache gc --json` prints.
pub async fn gc(State(st): State<Arc<AppState>>, body: Bytes) -> Result<Json<Value>, AppError> {
    let field = |field: &str, message: String| {
        AppError::Invalid(vec![FieldError {
            field: field.into(),
            message,
            line: None,
        }])
    };
    let b: GcBody = if body.iter().all(u8::is_ascii_whitespace) {
        GcBody::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| field("body", e.to_string()))?
    };
    let opts = GcOptions {
        max_size: b
            .max_size
            .as_deref()
            .map(units::parse_size)
            .transpose()
            .map_err(|e| field("max_size", e.to_string()))?,
        max_inodes: b.max_inodes.map(|n| (n != 0).then_some(n)),
        max_age: b
            .max_age
            .as_deref()
            .map(units::parse_duration)
            .transpose()
            .map_err(|e| field("max_age", e.to_string()))?,
        dry_run: b.dry_run,
    };
    let report = blocking(move || Ok(st.store.gc(&opts)?)).await?;
    Ok(Json(json!(report)))
}
