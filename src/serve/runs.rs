//! Run history from the event log (`<store>/events.jsonl`, see [`crate::telemetry`]): one row per
//! cache preparation, newest first, with the time it saved against the median miss (the same
//! numbers `layercache stats` sums), per-day totals and the SVG chart of the runs page.

use maud::{Markup, html};
use serde::Serialize;

use super::view::iso_time;
use crate::telemetry::{self, Event};

/// One cache preparation of one run. Durations in ms, sizes in bytes.
#[derive(Clone, Debug, Serialize)]
pub struct RunRow {
    /// The run id: the event's `run` when the log has one, else `t<time_ms>-<cache>`.
    pub run: String,
    /// When the preparation ended, RFC 3339 UTC.
    pub time: String,
    /// The same, ms since the Unix epoch.
    pub time_ms: u64,
    /// The cache id.
    pub cache: String,
    /// `hit`, `restore` or `miss`; `save` for a save after COMMAND (`save = "success"`).
    pub result: &'static str,
    /// The exact key.
    pub key: String,
    /// The key of the layer a restore key matched (the key itself on a hit).
    pub matched_key: Option<String>,
    /// Time to mount, ms.
    pub mount_ms: u64,
    /// Setup script, ms.
    pub setup_ms: u64,
    /// Maintenance script, ms.
    pub maintenance_ms: u64,
    /// Promotion, ms.
    pub promote_ms: u64,
    /// mount + setup + maintenance + promote, ms.
    pub prep_ms: u64,
    /// Bytes in the layer.
    pub bytes: u64,
    /// Files in the layer.
    pub files: u64,
    /// Exit status of setup or maintenance.
    pub exit_status: i32,
    /// Whether a layer was published.
    pub published: bool,
    /// Time saved against the median successful miss of this project and cache, ms.
    pub saved_ms: u64,
    /// Regular files the promotion stored as new objects.
    pub new_files: u64,
    /// Bytes the promotion added to the store.
    pub new_bytes: u64,
    /// On a miss or restore: what differs from the nearest layer's key inputs (its key first).
    pub why: Vec<String>,
}

/// `project`'s preparations (and saves after COMMAND), newest first, at most `limit`; what a
/// lazily mounted layer fetched while its run lasted ([`Event::lazy_fetch`]) is not a row.
pub fn history(events: &[Event], project: &str, limit: usize) -> Vec<RunRow> {
    let mine: Vec<Event> = events
        .iter()
        .filter(|e| e.project == project && !e.lazy_fetch)
        .cloned()
        .collect();
    let saved = telemetry::saved_ms(&mine);
    let mut rows: Vec<RunRow> = mine
        .iter()
        .zip(saved)
        .map(|(e, saved_ms)| RunRow {
            run: if e.run.is_empty() {
                format!("t{}-{}", e.time_ms, e.cache)
            } else {
                e.run.clone()
            },
            time: iso_time(e.time_ms),
            time_ms: e.time_ms,
            cache: e.cache.clone(),
            // A save after COMMAND (`save = "success"`) is its own row.
            result: if e.saved { "save" } else { e.result.as_str() },
            key: e.key.clone(),
            matched_key: e.matched_key.clone(),
            mount_ms: e.mount_ms,
            setup_ms: e.setup_ms,
            maintenance_ms: e.maintenance_ms,
            promote_ms: e.promote_ms,
            prep_ms: e.prep_ms(),
            bytes: e.bytes,
            files: e.files,
            exit_status: e.exit_status,
            published: e.published,
            saved_ms,
            new_files: e.new_files,
            new_bytes: e.new_bytes,
            why: e.why.clone(),
        })
        .collect();
    // Stable: events of one instant keep their log order, reversed.
    rows.reverse();
    rows.sort_by_key(|r| std::cmp::Reverse(r.time_ms));
    rows.truncate(limit);
    rows
}

/// One run: its preparations, cache by cache in the order the run prepared them, and its totals
/// (a run's own page; the "workspace preparation" panel of a Codex task). Durations
/// in ms.
#[derive(Clone, Debug, Serialize)]
pub struct RunDetail {
    /// The run id.
    pub run: String,
    /// The project.
    pub project: String,
    /// When its first preparation ended, RFC 3339 UTC.
    pub time: String,
    /// Its preparations, in run order.
    pub caches: Vec<RunRow>,
    /// Their total preparation time, ms.
    pub prep_ms: u64,
    /// Their total time saved, ms.
    pub saved_ms: u64,
    /// The first non-zero exit status of a setup or maintenance (0 when every one succeeded).
    pub exit_status: i32,
}

/// The run `run` of `project` in `events` (ids as [`RunRow::run`] shows them); `None` when no
/// event has it.
pub fn run_detail(events: &[Event], project: &str, run: &str) -> Option<RunDetail> {
    let mut caches: Vec<RunRow> = history(events, project, usize::MAX)
        .into_iter()
        .filter(|r| r.run == run)
        .collect();
    // history is newest first; a run's page lists its caches in the order it prepared them.
    caches.reverse();
    let first = caches.first()?;
    Some(RunDetail {
        run: run.to_string(),
        project: project.to_string(),
        time: first.time.clone(),
        prep_ms: caches.iter().map(|r| r.prep_ms).sum(),
        saved_ms: caches.iter().map(|r| r.saved_ms).sum(),
        exit_status: (caches.iter().map(|r| r.exit_status))
            .find(|s| *s != 0)
            .unwrap_or(0),
        caches,
    })
}

/// One UTC day of preparations.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Day {
    /// `YYYY-MM-DD` (UTC).
    pub day: String,
    /// Preparations that day.
    pub runs: u64,
    /// Their total preparation time, ms.
    pub prep_ms: u64,
    /// Their total time saved, ms.
    pub saved_ms: u64,
}

/// Per-day totals of `rows`, oldest day first.
pub fn per_day(rows: &[RunRow]) -> Vec<Day> {
    let mut days: std::collections::BTreeMap<String, Day> = Default::default();
    for r in rows {
        let day = r.time[..10].to_string();
        let d = days.entry(day.clone()).or_insert(Day {
            day,
            runs: 0,
            prep_ms: 0,
            saved_ms: 0,
        });
        d.runs += 1;
        d.prep_ms += r.prep_ms;
        d.saved_ms += r.saved_ms;
    }
    days.into_values().collect()
}

/// A bar chart of preparation time and time saved per day (two bars a day, seconds on the y
/// axis), as inline SVG drawn on the server; it scales to the page width.
pub fn chart(days: &[Day]) -> Markup {
    const W: f64 = 640.0;
    const H: f64 = 240.0;
    const LEFT: f64 = 56.0;
    const BOTTOM: f64 = 36.0;
    const TOP: f64 = 28.0;
    let max_ms = days
        .iter()
        .map(|d| d.prep_ms.max(d.saved_ms))
        .max()
        .unwrap_or(0)
        .max(1);
    let top_s = nice_ceiling(max_ms as f64 / 1000.0);
    let plot_h = H - BOTTOM - TOP;
    let plot_w = W - LEFT - 8.0;
    let slot = plot_w / days.len().max(1) as f64;
    let bar = (slot * 0.35).min(48.0);
    let y_of = |ms: u64| TOP + plot_h - plot_h * (ms as f64 / 1000.0) / top_s;
    let ticks: Vec<f64> = (0..=4).map(|i| top_s * i as f64 / 4.0).collect();
    html! {
        svg #chart xmlns="http://www.w3.org/2000/svg" viewBox={"0 0 " (W) " " (H)}
            role="img" aria-label="Preparation time and time saved per day" {
            title { "Preparation time and time saved per day (seconds)" }
            g.legend {
                rect x=(LEFT) y="6" width="12" height="12" class="prep" {}
                text x=(LEFT + 18.0) y="16" { "preparation" }
                rect x=(LEFT + 120.0) y="6" width="12" height="12" class="saved" {}
                text x=(LEFT + 138.0) y="16" { "time saved" }
            }
            @for t in &ticks {
                @let y = TOP + plot_h - plot_h * t / top_s;
                line.grid x1=(LEFT) x2=(W - 8.0) y1=(y) y2=(y) {}
                text.axis x=(LEFT - 6.0) y=(y + 4.0) text-anchor="end" { (fmt_seconds(*t)) }
            }
            @for (i, d) in days.iter().enumerate() {
                @let x = LEFT + slot * i as f64 + slot / 2.0;
                rect.prep x=(x - bar) y=(y_of(d.prep_ms)) width=(bar)
                    height=(TOP + plot_h - y_of(d.prep_ms)) data-day=(d.day) {
                    title { (d.day) ": preparation " (telemetry::fmt_ms(d.prep_ms)) " in " (d.runs) " preparation(s)" }
                }
                rect.saved x=(x) y=(y_of(d.saved_ms)) width=(bar)
                    height=(TOP + plot_h - y_of(d.saved_ms)) data-day=(d.day) {
                    title { (d.day) ": saved " (telemetry::fmt_ms(d.saved_ms)) }
                }
                text.axis x=(x) y=(H - BOTTOM + 16.0) text-anchor="middle" { (&d.day[5..]) }
            }
            line.base x1=(LEFT) x2=(W - 8.0) y1=(TOP + plot_h) y2=(TOP + plot_h) {}
            text.axis x="4" y=(TOP - 8.0) { "s" }
        }
    }
}

/// The smallest of 1, 2, 5 × 10^n seconds at or above `s` (the chart's top).
fn nice_ceiling(s: f64) -> f64 {
    let mut step = 0.1;
    loop {
        for m in [1.0, 2.0, 5.0] {
            if m * step >= s {
                return m * step;
            }
        }
        step *= 10.0;
    }
}

fn fmt_seconds(s: f64) -> String {
    if s >= 10.0 || s == s.trunc() {
        format!("{s:.0}")
    } else {
        format!("{s:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::CacheResult;

    fn ev(t: u64, result: CacheResult, setup: u64) -> Event {
        Event {
            time_ms: t,
            mount_ms: 10,
            setup_ms: setup,
            ..crate::telemetry::sample_event(result)
        }
    }

    /// The hand-written OpenAPI schema of `GET …/runs` names exactly the fields a row has.
    #[test]
    fn openapi_runs_schema_matches_the_row() {
        let rows = history(&[ev(1, CacheResult::Miss, 5)], "p", 10);
        let row = serde_json::to_value(&rows[0]).unwrap();
        let mut have: Vec<&String> = row.as_object().unwrap().keys().collect();
        let doc = super::super::openapi::document("layercache_session_7878");
        let props = &doc["components"]["schemas"]["Runs"]["items"]["properties"];
        let mut documented: Vec<&String> = props.as_object().unwrap().keys().collect();
        have.sort();
        documented.sort();
        assert_eq!(have, documented);
    }

    /// Likewise for `GET …/runs/{run}`.
    #[test]
    fn openapi_run_schema_matches_the_detail() {
        let events = [Event {
            run: "r".into(),
            ..ev(1, CacheResult::Miss, 5)
        }];
        let d = serde_json::to_value(run_detail(&events, "p", "r").unwrap()).unwrap();
        let mut have: Vec<&String> = d.as_object().unwrap().keys().collect();
        let doc = super::super::openapi::document("layercache_session_7878");
        let props = &doc["components"]["schemas"]["Run"]["properties"];
        let mut documented: Vec<&String> = props.as_object().unwrap().keys().collect();
        have.sort();
        documented.sort();
        assert_eq!(have, documented);
    }

    #[test]
    fn newest_first_with_savings_and_days() {
        let day = 86_400_000;
        let events = vec![
            ev(day, CacheResult::Miss, 9_990),
            ev(day + 5, CacheResult::Hit, 0),
            ev(2 * day, CacheResult::Hit, 990),
        ];
        let rows = history(&events, "p", 10);
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0].time_ms, 2 * day);
        assert_eq!(rows[0].saved_ms, 9_000);
        assert_eq!(rows[1].saved_ms, 9_990);
        assert_eq!(rows[2].saved_ms, 0);
        assert_eq!(
            rows.iter().map(|r| r.saved_ms).sum::<u64>(),
            telemetry::stats(&events, Some("p")).saved_ms
        );
        assert_eq!(history(&events, "p", 1).len(), 1);
        // One run's page: its caches in run order, the totals, unknown runs none.
        let mut two = vec![
            Event {
                run: "r1".into(),
                cache: "nm".into(),
                ..ev(day, CacheResult::Miss, 9_990)
            },
            Event {
                run: "r1".into(),
                cache: "npm".into(),
                exit_status: 3,
                ..ev(day + 1, CacheResult::Miss, 100)
            },
        ];
        two.push(Event {
            run: "r2".into(),
            cache: "nm".into(),
            ..ev(day + 9, CacheResult::Hit, 0)
        });
        let d = run_detail(&two, "p", "r1").unwrap();
        let caches: Vec<&str> = d.caches.iter().map(|r| r.cache.as_str()).collect();
        assert_eq!(caches, ["nm", "npm"]);
        assert_eq!((d.prep_ms, d.exit_status), (10_000 + 110, 3));
        let d = run_detail(&two, "p", "r2").unwrap();
        assert_eq!((d.caches.len(), d.saved_ms), (1, 9_990));
        assert!(run_detail(&two, "p", "r3").is_none());
        assert!(run_detail(&two, "q", "r1").is_none());
        assert!(history(&events, "q", 10).is_empty());
        let days = per_day(&rows);
        assert_eq!(days.len(), 2);
        assert_eq!(days[0].day, "1970-01-02");
        assert_eq!((days[0].runs, days[0].prep_ms), (2, 10_010));
        let svg = chart(&days).into_string();
        assert!(svg.contains("<svg id=\"chart\""), "{svg}");
        assert_eq!(svg.matches("class=\"prep\" x=").count(), 2, "{svg}");
        assert_eq!(nice_ceiling(11.0), 20.0);
        assert_eq!(nice_ceiling(0.3), 0.5);
    }
}
