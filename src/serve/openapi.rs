//! The OpenAPI 3.1 document served at `/api/v1/openapi.json`, written by hand from
//! [`ROUTES`]; a unit test sends every listed operation through the router and checks that it
//! reaches a handler. Every operation, this document's own included, requires the token (the
//! top-level `security`: a bearer token, or the login cookie).

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};

/// `GET /api/v1/openapi.json`: [`document`], naming this server's login cookie.
pub async fn serve(State(st): State<Arc<super::AppState>>) -> Json<Value> {
    Json(document(st.auth.cookie_name()))
}

/// One documented operation: path (OpenAPI template syntax), method, summary, success
/// response schema name, whether it takes a body.
pub struct Operation {
    /// e.g. `/api/v1/projects/{project}/caches`.
    pub path: &'static str,
    /// `get`, `put`, `post` or `delete`.
    pub method: &'static str,
    /// One line for humans.
    pub summary: &'static str,
    /// Schema of the 200 answer (a key of `components.schemas`).
    pub schema: &'static str,
    /// The request body's media types, if it takes one.
    pub body: &'static [&'static str],
}

const SPEC_TYPES: &[&str] = &["application/toml", "text/plain", "application/json"];

/// Every operation of the API.
pub const ROUTES: &[Operation] = &[
    Operation {
        path: "/api/v1/openapi.json",
        method: "get",
        summary: "This document.",
        schema: "Any",
        body: &[],
    },
    Operation {
        path: "/api/v1/projects",
        method: "get",
        summary: "Usage per project.",
        schema: "Projects",
        body: &[],
    },
    Operation {
        path: "/api/v1/projects/{project}/caches",
        method: "get",
        summary: "The project's caches and their layers, one row per key.",
        schema: "Caches",
        body: &[],
    },
    Operation {
        path: "/api/v1/projects/{project}/caches",
        method: "delete",
        summary: "Clear every cache of the project (409 lists layers in use).",
        schema: "ClearReport",
        body: &[],
    },
    Operation {
        path: "/api/v1/projects/{project}/caches/{cache}",
        method: "delete",
        summary: "Clear one cache (409 lists layers in use).",
        schema: "ClearReport",
        body: &[],
    },
    Operation {
        path: "/api/v1/projects/{project}/caches/{cache}/keys/{key}",
        method: "delete",
        summary: "Clear the layer of one key (409 when it is in use).",
        schema: "ClearReport",
        body: &[],
    },
    Operation {
        path: "/api/v1/projects/{project}/runs",
        method: "get",
        summary: "Preparations newest first (?limit=N, default 100), with time saved against the median miss.",
        schema: "Runs",
        body: &[],
    },
    Operation {
        path: "/api/v1/projects/{project}/runs/{run}",
        method: "get",
        summary: "One run: per cache its result, key, matched restore key, why, setup/maintenance/promote times, new files/bytes, time saved and exit status; and the run's totals (400 for a malformed run id, 404 for an unknown run).",
        schema: "Run",
        body: &[],
    },
    Operation {
        path: "/api/v1/projects/{project}/stats",
        method: "get",
        summary: "What `layercache stats --project P --json` prints.",
        schema: "Stats",
        body: &[],
    },
    Operation {
        path: "/api/v1/projects/{project}/spec",
        method: "get",
        summary: "The project's stored spec (current version).",
        schema: "StoredSpec",
        body: &[],
    },
    Operation {
        path: "/api/v1/projects/{project}/spec",
        method: "put",
        summary: "Validate and store a new version of the project's spec (422 with field errors).",
        schema: "Saved",
        body: SPEC_TYPES,
    },
    Operation {
        path: "/api/v1/specs/validate",
        method: "post",
        summary: "Validate a spec like `layercache run` does (422 with field errors).",
        schema: "Valid",
        body: SPEC_TYPES,
    },
    Operation {
        path: "/api/v1/gc",
        method: "post",
        summary: "What `layercache gc --json` prints; body {\"dry_run\": true, \"max_size\", \"max_inodes\", \"max_age\"}, all optional.",
        schema: "GcReport",
        body: &["application/json"],
    },
];

fn error_response(desc: &str) -> Value {
    json!({"description": desc, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}})
}

fn params(path: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for name in ["project", "cache", "key"] {
        if path.contains(&format!("{{{name}}}")) {
            out.push(json!({"name": name, "in": "path", "required": true,
                "schema": {"type": "string", "pattern": "^[A-Za-z0-9_+=@,][A-Za-z0-9._+=@,:-]*$"},
                "description": format!("A {name} id as the CLI takes it (no '..', '/', control characters); 400 otherwise.")}));
        }
    }
    if path.contains("{run}") {
        out.push(json!({"name": "run", "in": "path", "required": true, "schema": {"type": "string"},
            "description": "A run id as `layercache run` prints it (`t<time_ms>-<cache>` for events logged before run ids); 404 when the project has no such run."}));
    }
    if path.ends_with("/runs") {
        out.push(json!({"name": "limit", "in": "query", "required": false,
            "schema": {"type": "integer", "minimum": 1, "maximum": super::api::RUNS_MAX}}));
    }
    out
}

/// The OpenAPI operation object of `op`: its summary, parameters, responses (200 with its
/// schema; 400/404 for a path with ids, 409 for a delete, 422 for a body, 401 always) and
/// request body.
fn operation(op: &Operation) -> Value {
    let mut responses = serde_json::Map::new();
    responses.insert("200".into(), json!({"description": "OK", "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{}", op.schema)}}}}));
    if op.path.contains('{') {
        responses.insert("400".into(), error_response("A bad id, named."));
        responses.insert(
            "404".into(),
            error_response("Unknown project/cache/key; `exists` lists what there is."),
        );
    }
    if op.method == "delete" {
        responses.insert(
            "409".into(),
            error_response("Layers in use (mounted) were refused; `in_use` lists them."),
        );
    }
    if !op.body.is_empty() {
        responses.insert(
            "422".into(),
            error_response("Invalid body; `errors` = [{field, message, line}]."),
        );
    }
    responses.insert(
        "401".into(),
        error_response(
            "No token: send `Authorization: Bearer <token>` or the login cookie (every \
             operation needs one).",
        ),
    );
    let mut o =
        json!({"summary": op.summary, "parameters": params(op.path), "responses": responses});
    if !op.body.is_empty() {
        let content: serde_json::Map<String, Value> = op.body.iter()
            .map(|t| (t.to_string(), json!({"schema": {"type": if *t == "application/json" && op.schema == "GcReport" { "object" } else { "string" }}})))
            .collect();
        o["requestBody"] = json!({"required": op.schema != "GcReport", "content": content});
    }
    o
}

/// The document (OpenAPI 3.1); `cookie` is the login cookie's name
/// (`layercache_session_<port>`).
pub fn document(cookie: &str) -> Value {
    let mut paths = serde_json::Map::new();
    for op in ROUTES {
        paths
            .entry(op.path.to_string())
            .or_insert_with(|| json!({}))[op.method] = operation(op);
    }
    let s = |props: Value| json!({"type": "object", "properties": props});
    let ts = json!({"type": "string", "format": "date-time"});
    // The row of `GET …/runs` (also the caches of `GET …/runs/{run}`), built apart: one json!
    // this size exceeds the macro recursion limit.
    let run_row = s(
        json!({"run": {"type": "string"}, "time": ts, "time_ms": {"type": "integer"},
                    "cache": {"type": "string"}, "result": {"enum": ["hit", "restore", "miss", "save"]}, "key": {"type": "string"},
                    "matched_key": {"type": ["string", "null"]}, "mount_ms": {"type": "integer"}, "setup_ms": {"type": "integer"},
                    "maintenance_ms": {"type": "integer"}, "promote_ms": {"type": "integer"}, "prep_ms": {"type": "integer"},
                    "bytes": {"type": "integer"}, "files": {"type": "integer"}, "exit_status": {"type": "integer"},
                    "published": {"type": "boolean"}, "saved_ms": {"type": "integer"}, "new_files": {"type": "integer"},
                    "new_bytes": {"type": "integer"}, "why": {"type": "array", "items": {"type": "string"}}}),
    );
    let mut doc = json!({
        "openapi": "3.1.0",
        "info": {"title": "layercache", "version": env!("CARGO_PKG_VERSION"),
            "description": "The store of `layercache`: projects, caches, layers, runs and stored specs. \
                Every operation needs the token: `Authorization: Bearer <token>`, or the login cookie that \
                `GET /login?token=<token>` (the URL `layercache serve` prints) or the login form sets. \
                Without `--token-file` the token is the store's own, in `<store>/v1/serve-token` (mode 0600: \
                the store's owner and root can read it). Requests without it answer 401."},
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}, {"cookie": []}],
        "paths": paths,
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer",
                    "description": "The token: `--token-file`'s, or the store's `<store>/v1/serve-token`."},
                "cookie": {"type": "apiKey", "in": "cookie", "name": cookie,
                    "description": "The login cookie (a session of this server process), set by `GET /login?token=…` or the login form."}
            },
            "schemas": {
                "Any": {},
                "Error": s(json!({"error": {"type": "string"}, "exists": {"type": "array", "items": {"type": "string"}},
                    "in_use": {"type": "array", "items": {"type": "string"}}, "removed": {"type": "array", "items": {"type": "string"}},
                    "ok": {"type": "boolean"}, "errors": {"type": "array", "items": {"$ref": "#/components/schemas/FieldError"}}})),
                "FieldError": s(json!({"field": {"type": "string"}, "message": {"type": "string"}, "line": {"type": "integer"}})),
                "Projects": {"type": "array", "items": s(json!({"project": {"type": "string"}, "caches": {"type": "integer"},
                    "layers": {"type": "integer"}, "bytes": {"type": "integer"}, "last_used": {"type": ["string", "null"], "format": "date-time"}}))},
                "Caches": {"type": "array", "items": s(json!({"cache": {"type": "string"}, "layers": {"type": "array", "items": s(json!({
                    "key": {"type": ["string", "null"]}, "layer": {"type": "string"}, "bytes": {"type": "integer"}, "files": {"type": "integer"},
                    "created": ts, "last_used": ts, "hits": {"type": "integer"}, "in_use": {"type": "boolean"}}))}}))},
                "ClearReport": s(json!({"removed": {"type": "array", "items": {"type": "string"}}, "in_use": {"type": "array", "items": {"type": "string"}}, "removed_objects": {"type": "integer"}})),
                "Runs": {"type": "array", "items": run_row},
                "Stats": s(json!({"results": {"type": "object"}, "failed": {"type": "integer"}, "saved_ms": {"type": "integer"}})),
                "CacheSummary": s(json!({"id": {"type": "string"}, "key": {"type": ["string", "null"], "description": "The key of the project's last run for this cache."},
                    "restore_keys": {"type": "array", "items": {"type": "string"}}, "mountpoint": {"type": "string"}})),
                "Valid": s(json!({"ok": {"const": true}, "caches": {"type": "array", "items": {"$ref": "#/components/schemas/CacheSummary"}}})),
                "StoredSpec": s(json!({"project": {"type": "string"}, "version": {"type": "integer"}, "format": {"enum": ["toml", "json"]}, "saved": ts,
                    "spec": {"type": "string"}, "versions": {"type": "array", "items": {"type": "integer"}},
                    "caches": {"type": "array", "items": {"$ref": "#/components/schemas/CacheSummary"}}})),
                "Saved": s(json!({"ok": {"const": true}, "project": {"type": "string"}, "version": {"type": "integer"}, "format": {"type": "string"}, "saved": ts,
                    "caches": {"type": "array", "items": {"$ref": "#/components/schemas/CacheSummary"}}})),
                "GcReport": s(json!({"dry_run": {"type": "boolean"}, "before": {"type": "object"}, "after": {"type": "object"},
                    "evicted": {"type": "array", "items": {"type": "string"}}, "in_use": {"type": "integer"}, "removed_objects": {"type": "integer"},
                    "freed_bytes": {"type": "integer"}, "removed_staging": {"type": "integer"}, "removed_runs": {"type": "integer"}, "ended_warm": {"type": "integer"}, "removed_orphans": {"type": "integer"}, "removed_partial": {"type": "integer"}, "removed_view_dirs": {"type": "integer"},
                    "removed_failed_logs": {"type": "integer"}, "failed_logs": {"type": "array", "items": {"type": "string"}}}))
            }
        }
    });
    let schemas = &mut doc["components"]["schemas"];
    schemas["Run"] = s(
        json!({"run": {"type": "string"}, "project": {"type": "string"}, "time": ts,
        "caches": {"type": "array", "items": run_row}, "prep_ms": {"type": "integer"},
        "saved_ms": {"type": "integer"}, "exit_status": {"type": "integer"}}),
    );
    let cache_stats = s(
        json!({"project": {"type": "string"}, "cache": {"type": "string"},
        "hits": {"type": "integer"}, "restores": {"type": "integer"}, "misses": {"type": "integer"},
        "failed": {"type": "integer"}, "median_miss_ms": {"type": "integer"},
        "median_hit_ms": {"type": "integer"}, "saved_ms": {"type": "integer"}}),
    );
    schemas["Stats"] = s(
        json!({"results": {"type": "object"}, "failed": {"type": "integer"},
        "saved_ms": {"type": "integer"}, "remote_hits": {"type": "integer"},
        "pulled_bytes": {"type": "integer"}, "lazy_bytes": {"type": "integer"}, "caches": {"type": "array", "items": cache_stats}}),
    );
    doc
}

#[cfg(test)]
mod tests {
    /// Every field a gc report carries is in its schema (a field added to the report and not
    /// here was invisible to a client generated from the document).
    #[test]
    fn gc_report_schema_lists_every_field() {
        let doc = super::document("c");
        let props = &doc["components"]["schemas"]["GcReport"]["properties"];
        let report = serde_json::to_value(crate::store::GcReport::default()).unwrap();
        let fields: Vec<&String> = report.as_object().unwrap().keys().collect();
        assert!(fields.contains(&&"failed_logs".to_string()), "{fields:?}");
        for f in fields {
            assert!(props.get(f).is_some(), "GcReport schema lacks {f}: {props}");
        }
    }
}
