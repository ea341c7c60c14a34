//! What a run prints about its preparation: the summary (a line per cache on stderr, or the
//! `--json` object on stdout) and byte counts in binary units.

use crate::units::fmt_bytes;
use std::io::Write;

use super::{Prep, RunConfig};
use crate::telemetry::{self, CacheResult};

/// The summary: one line per cache on stderr, or with `--json` one JSON object on stdout
/// (run id, and per cache its event, view path and mount run id; for `run --project P`,
/// `stored_spec`: the version and save time of the stored spec).
pub(super) fn print_summary(cfg: &RunConfig, preps: &[Prep]) {
    let mut err = std::io::stderr().lock();
    if cfg.json {
        let caches: Vec<serde_json::Value> = preps
            .iter()
            .map(|p| {
                let mut v = serde_json::to_value(&p.event).unwrap_or_default();
                v["view"] = serde_json::json!(p.keys.mountpoint);
                v["mount_run"] = serde_json::json!(p.mounted.run);
                v
            })
            .collect();
        let mut v = serde_json::json!({
            "run": cfg.run_id,
            "project": cfg.spec.project.as_str(),
            "caches": caches,
            "prep_ms": preps.iter().map(|p| p.event.prep_ms()).sum::<u64>(),
        });
        if let Some(origin) = &cfg.stored_spec {
            v["stored_spec"] = origin.to_json();
        }
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{v}");
        let _ = out.flush();
        return;
    }
    for p in preps {
        let _ = writeln!(err, "{}", summary_line(&p.event));
    }
}

/// One cache's summary line (`layercache: deps hit in 12 ms (pulled from the remote: 200
/// objects, 2.2 KiB in 1.5 s)`), from its event alone, so the line and the `--json` event
/// (its `pulled_objects`, `pulled_bytes`, `pulled_ms`) tell the same numbers.
pub(super) fn summary_line(e: &telemetry::Event) -> String {
    let mut line = format!(
        "layercache: {} {} in {}",
        e.cache,
        e.result.as_str(),
        telemetry::fmt_ms(e.prep_ms())
    );
    // A layer that came from the remote tier says so (its JSON has `remote_hit`).
    let pulled = e.remote_hit.then(|| match e.remote_lazy {
        true => format!(
            "mounted lazily from the remote: {} to fetch on first read",
            fmt_bytes(e.lazy_bytes)
        ),
        false => format!(
            "pulled from the remote: {} objects, {} in {}",
            e.pulled_objects,
            fmt_bytes(e.pulled_bytes),
            telemetry::fmt_ms(e.pulled_ms)
        ),
    });
    match e.result {
        CacheResult::Hit => {
            let maintenance = (e.maintenance_ms > 0)
                .then(|| format!("maintenance {}", telemetry::fmt_ms(e.maintenance_ms)));
            let parts: Vec<String> = pulled.iter().cloned().chain(maintenance).collect();
            if !parts.is_empty() {
                line.push_str(&format!(" ({})", parts.join("; ")));
            }
        }
        _ => line.push_str(&format!(
            " (setup {}, promote {}: {}, {}; new {}, {})",
            telemetry::fmt_ms(e.setup_ms),
            telemetry::fmt_ms(e.promote_ms),
            crate::units::fmt_files(e.files),
            fmt_bytes(e.bytes),
            crate::units::fmt_files(e.new_files),
            fmt_bytes(e.new_bytes)
        )),
    }
    if e.result == CacheResult::Restore
        && let Some(m) = &e.matched_key
    {
        line.push_str(&format!(" from {m}"));
        if let Some(pulled) = &pulled {
            line.push_str(&format!(" ({pulled})"));
        }
    }
    // What differs from the nearest layer (its key is in --json and events).
    let why: Vec<&str> = (e.why.iter().map(String::as_str))
        .filter(|w| !w.starts_with("nearest layer "))
        .collect();
    if !why.is_empty() {
        line.push_str(&format!("; why: {}", why.join(", ")));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A remote hit's line and its `--json` event both carry the pull's duration (a consumer
    /// of the event had the objects and bytes but no time: "2.2 KiB in )").
    #[test]
    fn a_remote_hit_says_how_long_its_pull_took() {
        let e = telemetry::Event {
            remote_hit: true,
            pulled_objects: 200,
            pulled_bytes: 2253,
            pulled_ms: 1500,
            remote_lazy: false,
            lazy_bytes: 0,
            mount_ms: 1600,
            ..telemetry::sample_event(CacheResult::Hit)
        };
        let line = summary_line(&e);
        assert_eq!(
            line,
            "layercache: npm hit in 1.6 s (pulled from the remote: 200 objects, 2.2 KiB in 1.5 s)"
        );
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(json["pulled_ms"], 1500, "{json}");
        // Old events without it read as 0.
        let mut old = json.clone();
        old.as_object_mut().unwrap().remove("pulled_ms");
        let back: telemetry::Event = serde_json::from_value(old).unwrap();
        assert_eq!(back.pulled_ms, 0);
    }
}
