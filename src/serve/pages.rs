//! Server-rendered pages (maud): projects, a project's caches with clear buttons, its runs with
//! a chart, and the spec editor. Plain HTML forms, no JavaScript; a narrow layout that reads
//! on a phone (tables scroll sideways inside their box). They show what the API returns: both
//! come from [`super::view`].

use std::sync::Arc;

use axum::Form;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{DOCTYPE, Markup, PreEscaped, html};
use serde::Deserialize;

use super::AppState;
use super::errors::{AppError, FieldError};
use super::view::{self, CacheView, ClearTarget, blocking};
use crate::telemetry::fmt_ms;
use crate::units::fmt_bytes;

const CSS: &str = r#"
:root { color-scheme: light; --fg: #1d232a; --muted: #5b6570; --line: #d8dde3; --accent: #1f6feb;
  --bad: #b42318; --ok: #137333; --prep: #1f6feb; --saved: #2da44e; }
* { box-sizing: border-box; }
body { font: 16px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg);
  margin: 0; background: #f6f8fa; }
header { background: #1d232a; color: #fff; padding: .6rem 1rem; display: flex; gap: 1rem;
  flex-wrap: wrap; align-items: baseline; }
header a { color: #fff; text-decoration: none; }
header .muted { color: #aab4be; margin-left: auto; font-size: .85rem; }
header .brand { font-weight: 700; }
main { max-width: 72rem; margin: 0 auto; padding: 1rem; }
h1 { font-size: 1.4rem; margin: .2rem 0 1rem; overflow-wrap: anywhere; }
h2 { font-size: 1.1rem; margin: 1.5rem 0 .5rem; }
nav.tabs { display: flex; gap: .8rem; flex-wrap: wrap; margin-bottom: 1rem; }
.box { background: #fff; border: 1px solid var(--line); border-radius: 6px; overflow-x: auto; }
table { border-collapse: collapse; width: 100%; font-size: .92rem; }
th, td { text-align: left; padding: .4rem .6rem; border-bottom: 1px solid var(--line);
  vertical-align: top; }
th { background: #eef1f4; font-weight: 600; white-space: nowrap; }
td.num, th.num { text-align: right; white-space: nowrap; }
code, .key { font: .85rem ui-monospace, SFMono-Regular, Menlo, monospace; overflow-wrap: anywhere; }
.notice { border-left: 4px solid var(--ok); background: #e9f6ec; padding: .6rem .8rem; }
.refused, .field-error { border-left: 4px solid var(--bad); background: #fdecea; padding: .6rem .8rem; }
.field-error { margin: .3rem 0; }
.field-error .field { font-weight: 600; font-family: ui-monospace, monospace; }
.result-hit { color: var(--ok); font-weight: 600; }
.result-miss { color: var(--bad); font-weight: 600; }
.result-restore { color: #9a6700; font-weight: 600; }
button, .button { font: inherit; padding: .35rem .8rem; border-radius: 5px; border: 1px solid #8c959f;
  background: #fff; cursor: pointer; color: var(--fg); text-decoration: none; display: inline-block; }
button.danger, .button.danger { border-color: var(--bad); color: var(--bad); }
form.inline { display: inline; }
textarea { width: 100%; min-height: 18rem; font: .9rem ui-monospace, monospace; padding: .5rem; }
div.lines { padding: .5rem 0; font: .85rem ui-monospace, SFMono-Regular, Menlo, monospace; }
div.lines .line { white-space: pre-wrap; overflow-wrap: anywhere; padding: 0 .5rem; }
div.lines .line .n { display: inline-block; width: 2.5rem; color: var(--muted); user-select: none; }
div.lines .err { background: #fdecea; }
div.lines .field-error { margin: 0 0 .2rem 3rem; font-family: system-ui, sans-serif; }
figure { margin: 0 0 1rem; }
svg#chart { width: 100%; height: auto; max-width: 48rem; background: #fff; }
svg#chart .prep { fill: var(--prep); } svg#chart .saved { fill: var(--saved); }
svg#chart .grid { stroke: #e3e7eb; } svg#chart .base { stroke: #8c959f; }
svg#chart text { font-size: 12px; fill: var(--muted); }
.muted { color: var(--muted); }
label { display: block; font-weight: 600; margin: .5rem 0 .2rem; }
input[type=password] { font: inherit; padding: .3rem; width: min(100%, 24rem); }
h2 .button { font-size: .85rem; font-weight: normal; margin-left: .4rem; }
td.time { white-space: nowrap; }
td.why { overflow-wrap: anywhere; }
/* A key breaks only after a '-' (key_parts puts <wbr> there), never inside its hash: in a narrow
   window the table scrolls sideways in its box instead of stacking a key a few letters a line. */
.key.parts { overflow-wrap: normal; word-break: normal; }
table#preparation td.why { min-width: 14rem; }
/* Phones: each table row becomes a card of labelled lines. */
@media (max-width: 40rem) {
  .box { overflow-x: visible; border: 0; background: none; }
  table, tbody, tr, td { display: block; width: 100%; }
  thead { display: none; }
  tr { background: #fff; border: 1px solid var(--line); border-radius: 6px; margin-bottom: .6rem; }
  td, td.num { text-align: left; border: 0; padding: .2rem .6rem; white-space: normal; }
  td[data-label]::before { content: attr(data-label) ": "; color: var(--muted); }
}
"#;

/// A key (`<id>-<os>-<arch>-<env8>-<hash>`) with a `<wbr>` after each `-`: with the `.key.parts`
/// style it breaks only there, never inside its hash.
fn key_parts(key: &str) -> Markup {
    html! {
        @for (i, part) in key.split_inclusive('-').enumerate() {
            @if i > 0 { wbr; }
            (part)
        }
    }
}

/// Percent-encodes everything but unreserved characters (RFC 3986 section 2.3).
pub fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The page frame: title, navigation, inline CSS, a viewport for phones.
pub fn layout(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · layercache" }
                style { (PreEscaped(CSS)) }
            }
            body {
                header { a.brand href="/" { "layercache" } a href="/" { "projects" } span.muted { "times in UTC" } }
                main { (body) }
            }
        }
    }
}

/// An [`AppError`] rendered as a page with the same status.
pub struct PageError(pub AppError);

impl From<AppError> for PageError {
    fn from(e: AppError) -> Self {
        PageError(e)
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let e = self.0;
        let body = html! {
            h1 { (e.status().as_u16()) " " (e.status().canonical_reason().unwrap_or("")) }
            p.refused role="alert" { (e.to_string()) }
            @if let AppError::NotFound { exists, .. } = &e {
                @if exists.is_empty() { p.muted { "There is nothing here yet." } }
                @else { p { "What exists: " } ul { @for n in exists { li { code { (n) } } } } }
            }
        };
        (e.status(), layout("Error", body)).into_response()
    }
}

type Page = Result<Markup, PageError>;

/// `2026-12-01T07:50:03Z` as `2026-12-01 07:50:03` (pages say the times are UTC).
fn human_time(iso: &str) -> String {
    iso.trim_end_matches('Z').replacen('T', " ", 1)
}

fn tabs(project: &str) -> Markup {
    let p = urlencode(project);
    html! {
        nav.tabs {
            a href={"/projects/" (p)} { "caches" }
            a href={"/projects/" (p) "/runs"} { "runs" }
            a href={"/projects/" (p) "/spec"} { "spec" }
        }
    }
}

/// `GET /`: every project's usage.
pub async fn projects(State(st): State<Arc<AppState>>) -> Page {
    let rows = blocking(move || view::projects(&st.store)).await?;
    Ok(layout(
        "Projects",
        html! {
            h1 { "Projects" }
            @if rows.is_empty() { p.muted { "The store has no projects yet: " code { "layercache run" } " makes one." } }
            @else {
                div.box { table {
                    thead { tr { th { "project" } th.num { "caches" } th.num { "layers" } th.num { "size" } th { "last used" } } }
                    tbody { @for r in &rows { tr {
                        td { a href={"/projects/" (urlencode(r.project.as_str()))} { (r.project) } }
                        td.num data-label="caches" { (r.caches) } td.num data-label="layers" { (r.layers) }
                        td.num data-label="size" { (fmt_bytes(r.bytes)) }
                        td.time data-label="last used" { (r.last_used.as_deref().map_or("never".into(), human_time)) }
                    } } }
                } }
            }
        },
    ))
}

fn clear_link(project: &str, cache: Option<&str>, key: Option<&str>, label: &str) -> Markup {
    let mut href = format!("/projects/{}/clear", urlencode(project));
    let mut sep = '?';
    for (name, v) in [("cache", cache), ("key", key)] {
        if let Some(v) = v {
            href.push_str(&format!("{sep}{name}={}", urlencode(v)));
            sep = '&';
        }
    }
    html! { a.button.danger href=(href) { (label) } }
}

fn caches_table(project: &str, caches: &[CacheView]) -> Markup {
    html! {
        @for c in caches {
            section.cache data-cache=(c.cache) {
                h2 { "cache " code { (c.cache) } " " (clear_link(project, Some(c.cache.as_str()), None, "clear cache")) }
                @if c.layers.is_empty() { p.muted { "No layers." } }
                @else { div.box { table {
                    thead { tr { th { "key" } th.num { "size" } th.num { "files" } th { "created" } th { "last used" } th.num { "hits" } th { "in use" } th {} } }
                    tbody { @for l in &c.layers {
                        tr data-key=[l.key.as_ref().map(|k| k.as_str())] {
                            td { span.key { (l.key.as_ref().map_or("(unpublished)", |k| k.as_str())) } br; span.muted { "layer " code { (l.layer) } } }
                            td.num data-label="size" { (fmt_bytes(l.bytes)) } td.num data-label="files" { (l.files) }
                            td.time data-label="created" { (human_time(&l.created)) } td.time data-label="last used" { (human_time(&l.last_used)) }
                            td.num data-label="hits" { (l.hits) }
                            td data-label="in use" { @if l.in_use { strong { "mounted" } } @else { "no" } }
                            td { @if let Some(k) = &l.key { (clear_link(project, Some(c.cache.as_str()), Some(k.as_str()), "clear")) } }
                        }
                    } }
                } } }
            }
        }
    }
}

async fn project_page(st: Arc<AppState>, project: String, banner: Option<Markup>) -> Page {
    let caches = view::project_caches(st, view::project_id(&project)?).await?;
    Ok(layout(
        &project,
        html! {
            h1 { "Project " (project) }
            (tabs(&project))
            @if let Some(b) = banner { (b) }
            p { (clear_link(&project, None, None, "clear every cache of this project")) }
            @if caches.is_empty() { p.muted { "No caches yet." } }
            (caches_table(&project, &caches))
        },
    ))
}

/// `GET /projects/{project}`: caches and layers.
pub async fn project(State(st): State<Arc<AppState>>, Path(project): Path<String>) -> Page {
    project_page(st, project, None).await
}

/// What a clear form or link names: nothing (the project), a cache, or a cache's key.
#[derive(Debug, Deserialize)]
pub struct ClearForm {
    /// The cache id.
    pub cache: Option<String>,
    /// The key within the cache.
    pub key: Option<String>,
}

impl ClearForm {
    fn target(&self) -> Result<ClearTarget, AppError> {
        let nonempty =
            |s: &Option<String>| s.as_deref().filter(|s| !s.is_empty()).map(str::to_string);
        match (nonempty(&self.cache), nonempty(&self.key)) {
            (None, None) => Ok(ClearTarget::Project),
            (Some(c), None) => Ok(ClearTarget::Cache(view::cache_id(&c)?)),
            (Some(c), Some(k)) => Ok(ClearTarget::Key(view::cache_id(&c)?, view::cache_key(&k)?)),
            (None, Some(_)) => Err(AppError::BadRequest("key given without its cache".into())),
        }
    }
}

fn describe(project: &str, t: &ClearTarget) -> String {
    match t {
        ClearTarget::Project => format!("every cache of project {project}"),
        ClearTarget::Cache(c) => format!("cache {c} of project {project}"),
        ClearTarget::Key(c, k) => format!("key {k} of cache {c}"),
    }
}

/// `GET /projects/{project}/clear?cache=&key=`: the confirmation.
pub async fn clear_confirm(Path(project): Path<String>, Query(f): Query<ClearForm>) -> Page {
    view::project_id(&project)?;
    let target = f.target()?;
    Ok(layout(
        "Clear",
        html! {
            h1 { "Clear " (describe(&project, &target)) "?" }
            p { "The layers are removed from the store; the next run fills them again. Layers in use (mounted) are kept and listed." }
            form method="post" action={"/projects/" (urlencode(&project)) "/clear"} {
                @if let Some(c) = &f.cache { input type="hidden" name="cache" value=(c); }
                @if let Some(k) = &f.key { input type="hidden" name="key" value=(k); }
                button.danger type="submit" { "Clear" } " "
                a.button href={"/projects/" (urlencode(&project))} { "Cancel" }
            }
        },
    ))
}

/// `POST /projects/{project}/clear`: clears and shows the project page with what happened
/// (409 with the refused layers listed when some were in use).
pub async fn clear(
    State(st): State<Arc<AppState>>,
    Path(project): Path<String>,
    Form(f): Form<ClearForm>,
) -> Result<Response, PageError> {
    let p = view::project_id(&project)?;
    let target = f.target()?;
    let what = describe(&project, &target);
    let st2 = st.clone();
    let outcome = blocking(move || {
        let pd = view::require_project(&st2.store, &p)?;
        match view::clear(&st2.store, &pd, &target) {
            Ok(r) => Ok(Ok(r)),
            Err(e @ AppError::InUse { .. }) => Ok(Err(e)),
            Err(e) => Err(e),
        }
    })
    .await?;
    let (status, banner) = match outcome {
        Ok(r) => (
            StatusCode::OK,
            html! { p.notice role="status" { "Cleared " (what) ": removed " (r.removed.len()) " layer(s), " (r.removed_objects) " object(s)." } },
        ),
        Err(e) => (
            StatusCode::CONFLICT,
            html! { p.refused role="alert" { "Clearing " (what) ": " (e.to_string()) } },
        ),
    };
    let page = project_page(st, project, Some(banner)).await?;
    Ok((status, page).into_response())
}

/// `GET /projects/{project}/runs`: history and the per-day chart.
pub async fn runs(
    State(st): State<Arc<AppState>>,
    Path(project): Path<String>,
    Query(q): Query<super::api::RunsQuery>,
) -> Page {
    let p = view::project_id(&project)?;
    let limit = super::api::parse_limit(q.limit.as_deref())?;
    let (rows, stats) = blocking(move || {
        let events = view::known_project_events(&st.store, &p)?;
        let all = super::runs::history(&events, p.as_str(), usize::MAX);
        Ok((all, crate::telemetry::stats(&events, Some(p.as_str()))))
    })
    .await?;
    let days = super::runs::per_day(&rows);
    let shown = &rows[..rows.len().min(limit)];
    Ok(layout(
        &format!("Runs of {project}"),
        html! {
            h1 { "Runs of " (project) }
            (tabs(&project))
            p { (rows.len()) " preparation(s); time saved against the median miss: " strong { (fmt_ms(stats.saved_ms)) } }
            @if !days.is_empty() { figure { (super::runs::chart(&days)) } }
            div.box { table #runs {
                thead { tr { th { "time" } th { "cache" } th { "result" } th { "key" } th { "matched" } th.num { "preparation" } th.num { "saved" } th.num { "exit" } } }
                tbody { @for r in shown { tr {
                    td.time title={"run " (r.run)} { a.run href={"/projects/" (urlencode(&project)) "/runs/" (urlencode(&r.run))} data-run=(r.run) { (human_time(&r.time)) } } td data-label="cache" { (r.cache) }
                    td data-label="result" { span class={"result-" (r.result)} { (r.result) } }
                    td data-label="key" { span.key.parts { (key_parts(&r.key)) } }
                    td data-label="matched" { span.key.parts { @match r.matched_key.as_deref() { Some(m) if m == r.key => { "the key" } Some(m) => { (key_parts(m)) } None => { "—" } } } }
                    td.num data-label="preparation" title={"mount " (r.mount_ms) " ms, setup " (r.setup_ms) " ms, maintenance " (r.maintenance_ms) " ms, promote " (r.promote_ms) " ms"} { (fmt_ms(r.prep_ms)) }
                    td.num data-label="saved" { (fmt_ms(r.saved_ms)) } td.num data-label="exit" { (r.exit_status) }
                } } }
            } }
        },
    ))
}

/// `GET /projects/{project}/runs/{run}`: one run's own page — its "workspace
/// preparation" panel: per cache the result, key, matched restore key, why, the setup,
/// maintenance and promote times, what the promotion added, the time saved and the exit status;
/// and the run's totals. The same numbers as `GET /api/v1/projects/{project}/runs/{run}`.
pub async fn run(
    State(st): State<Arc<AppState>>,
    Path((project, run)): Path<(String, String)>,
) -> Page {
    let p = view::project_id(&project)?;
    let d = blocking(move || super::api::run_detail(&st, &p, &run)).await?;
    let ok = d.exit_status == 0;
    Ok(layout(
        &format!("Run {} of {project}", d.run),
        html! {
            h1 { "Run " span.key { (d.run) } " of " (project) }
            (tabs(&project))
            p #run-total {
                (human_time(&d.time)) " UTC · " (d.caches.len()) " cache(s) · preparation "
                strong { (fmt_ms(d.prep_ms)) } " · saved " strong { (fmt_ms(d.saved_ms)) } " · "
                @if ok { span.result-hit { "succeeded" } } @else { span.result-miss { "failed (exit " (d.exit_status) ")" } }
            }
            h2 { "Workspace preparation" }
            div.box { table #preparation {
                thead { tr { th { "cache" } th { "result" } th { "key" } th { "matched" } th { "why" } th.num { "setup" } th.num { "maintenance" } th.num { "promote" } th.num { "new" } th.num { "saved" } th.num { "exit" } } }
                tbody { @for r in &d.caches { tr data-cache=(r.cache) {
                    td data-label="cache" { (r.cache) }
                    td data-label="result" { span class={"result-" (r.result)} { (r.result) } }
                    td data-label="key" { span.key.parts { (key_parts(&r.key)) } }
                    td data-label="matched" { span.key.parts { @match r.matched_key.as_deref() { Some(m) if m == r.key => { "the key" } Some(m) => { (key_parts(m)) } None => { "—" } } } }
                    td.why data-label="why" { @if r.why.is_empty() { "—" } @else { (r.why.join("; ")) } }
                    td.num data-label="setup" { (fmt_ms(r.setup_ms)) }
                    td.num data-label="maintenance" { (fmt_ms(r.maintenance_ms)) }
                    td.num data-label="promote" { (fmt_ms(r.promote_ms)) }
                    td.num data-label="new" { (r.new_files) " files, " (fmt_bytes(r.new_bytes)) }
                    td.num data-label="saved" { (fmt_ms(r.saved_ms)) }
                    td.num data-label="exit" { (r.exit_status) }
                } } }
            } }
            p.muted { "Mount time " (fmt_ms(d.caches.iter().map(|r| r.mount_ms).sum())) " in all. " a href={"/projects/" (urlencode(&project)) "/runs"} { "All runs" } }
        },
    ))
}

const SPEC_TEMPLATE: &str =
    "project = \"{project}\"\n\n[[cache]]\nid = \"node_modules\"\npreset = \"node_modules\"\n";

fn spec_page(
    project: &str,
    text: &str,
    version: Option<(u64, u64)>,
    errors: &[FieldError],
    notice: Option<Markup>,
) -> Markup {
    let err_lines: Vec<usize> = errors.iter().filter_map(|e| e.line).collect();
    html! {
        h1 { "Spec of " (project) }
        (tabs(project))
        @if let Some(n) = notice { (n) }
        p.muted { @match version { Some((v, ms)) => { "Stored version " (v) ", saved " (human_time(&view::iso_time(ms))) " UTC." } None => { "No stored spec yet." } } " " code { "layercache run --project " (project) } " uses the stored spec." }
        @if !errors.is_empty() {
            div.box { div.lines { @for (i, line) in text.lines().enumerate() {
                @let n = i + 1;
                div class=(if err_lines.contains(&n) { "line err" } else { "line" }) { span.n { (n) } (line) }
                @for e in errors.iter().filter(|e| e.line == Some(n)) {
                    div.field-error data-field=(e.field) { "↑ " span.field { (e.field) } ": " (e.detail()) }
                }
            } } }
            @for e in errors.iter().filter(|e| e.line.is_none()) {
                p.field-error data-field=(e.field) { span.field { (e.field) } ": " (e.detail()) }
            }
        }
        form method="post" action={"/projects/" (urlencode(project)) "/spec"} {
            label for="spec" { "Spec (TOML or JSON)" }
            textarea #spec name="spec" spellcheck="false" { (text) }
            p { button type="submit" name="action" value="validate" { "Validate" } " " button type="submit" name="action" value="save" { "Save" } }
        }
    }
}

/// The current stored spec of the existing project `p`.
async fn stored_spec(
    st: Arc<AppState>,
    p: crate::ids::ProjectId,
) -> Result<Option<crate::store::StoredSpec>, AppError> {
    blocking(move || {
        let pd = view::require_project(&st.store, &p)?;
        Ok(pd.current_spec()?)
    })
    .await
}

/// `GET /projects/{project}/spec`: the editor with the stored spec (or a template).
pub async fn spec(State(st): State<Arc<AppState>>, Path(project): Path<String>) -> Page {
    let stored = stored_spec(st, view::project_id(&project)?).await?;
    let (text, version) = match stored {
        Some(s) => (s.text, Some((s.version, s.saved_ms))),
        None => (SPEC_TEMPLATE.replace("{project}", &project), None),
    };
    Ok(layout(
        &format!("Spec of {project}"),
        spec_page(&project, &text, version, &[], None),
    ))
}

/// The editor's fields.
#[derive(Debug, Deserialize)]
pub struct SpecForm {
    /// The spec text.
    pub spec: String,
    /// `validate` or `save`.
    pub action: Option<String>,
}

/// `POST /projects/{project}/spec`: validates, and saves when asked; errors shown next to the
/// lines they name (422).
pub async fn spec_post(
    State(st): State<Arc<AppState>>,
    Path(project): Path<String>,
    Form(f): Form<SpecForm>,
) -> Result<Response, PageError> {
    let p = view::project_id(&project)?;
    // Browsers send CRLF line ends from a textarea.
    let text = f.spec.replace("\r\n", "\n");
    let save = f.action.as_deref() == Some("save");
    let current = (stored_spec(st.clone(), p.clone()).await?).map(|s| (s.version, s.saved_ms));
    let checked = super::validation::validate(&text)
        .and_then(|spec| super::api::same_project(&spec, &text, &p).map(|()| spec));
    let title = format!("Spec of {project}");
    match checked {
        Err(AppError::Invalid(errors)) => {
            let page = layout(&title, spec_page(&project, &text, current, &errors, None));
            Ok((StatusCode::UNPROCESSABLE_ENTITY, page).into_response())
        }
        Err(e) => Err(e.into()),
        Ok(spec) if save => {
            let t = text.clone();
            let stored = blocking(move || {
                let pd = st.store.project(&p)?;
                Ok(pd.save_spec(&t)?)
            })
            .await?;
            let notice = html! { p.notice role="status" { "Saved as version " (stored.version) " (" (spec.caches.len()) " cache(s))." } };
            Ok(layout(
                &title,
                spec_page(
                    &project,
                    &text,
                    Some((stored.version, stored.saved_ms)),
                    &[],
                    Some(notice),
                ),
            )
            .into_response())
        }
        Ok(spec) => {
            let notice = html! { p.notice role="status" { "Valid: " (spec.caches.len()) " cache(s). Not saved yet." } };
            Ok(layout(
                &title,
                spec_page(&project, &text, current, &[], Some(notice)),
            )
            .into_response())
        }
    }
}

/// Any other path: 404 as a page.
pub async fn not_found(uri: axum::http::Uri) -> PageError {
    PageError(AppError::NotFound {
        what: format!("page {}", uri.path()),
        exists: vec!["/".into(), "/projects/{project}".into()],
    })
}
