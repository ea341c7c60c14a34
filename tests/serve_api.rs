//! `layercache serve`'s API over real HTTP on 127.0.0.1, against a store filled by real runs of
//! the npm fixture (tests/serve_fixture): listings agree with `layercache ls`/`stats`, the run
//! history, spec validation and the stored spec, 404s and 400s, clearing a layer that is
//! mounted (409, then cleared once unmounted), gc, the body limit, the same-origin check, the
//! token, and a graceful stop on SIGTERM. Needs root, /dev/fuse and npm (a skip otherwise; a
//! failure with `CI`). Every mount sits in a guard; the server is stopped by its pid.

mod serve_support;

use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};
use serve_support::mounts::{Mounted, is_mounted};
use serve_support::{
    BIN, PROJECT, Sandbox, Server, as_user, can_mount, can_run, filled_store, get_json, have_tool,
    lc_json, request, skip_or_fail, test_user,
};

const TOML: (&str, &str) = ("Content-Type", "application/toml");

fn keys_of(caches: &Value, cache: &str) -> Vec<String> {
    caches
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["cache"] == cache)
        .unwrap_or_else(|| panic!("no cache {cache} in {caches}"))["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["key"].as_str().unwrap().to_string())
        .collect()
}

/// Checks `doc` with openapi-spec-validator (`$LAYERCACHE_OPENAPI_PYTHON`, a Python that has it;
/// scripts/test.sh installs it), writing it to `file` first.
fn validate_openapi(doc: &Value, file: &Path) {
    let Some(python) = std::env::var_os("LAYERCACHE_OPENAPI_PYTHON") else {
        skip_or_fail(
            "the OpenAPI check needs $LAYERCACHE_OPENAPI_PYTHON (scripts/test.sh sets it)",
        );
        return;
    };
    std::fs::write(file, doc.to_string()).unwrap();
    let out = Command::new(python)
        .args(["-m", "openapi_spec_validator"])
        .arg(file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openapi-spec-validator: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn api_over_real_http_on_a_store_filled_by_real_npm_runs() {
    if !can_run() {
        return;
    }
    let sb = filled_store();
    let store = sb.path("store");
    // Another project in the same store: nothing of it may show under web-demo.
    let other = sb.write_spec(
        "other.toml",
        "project = \"other-demo\"\n\n[[cache]]\nid = \"node_modules\"\npreset = \"node_modules\"\n",
    );
    assert_eq!(sb.run(&other, None).status.code(), Some(0));
    let (server, said) = Server::start_text(&store, &[]);
    // Without --token-file: the store's token, printed once in the login URL, kept 0600.
    let token = server
        .token
        .clone()
        .expect("a login URL with the store's token");
    let token_file = store.join("v1/serve-token");
    assert_eq!(
        said[0],
        format!(
            "layercache: serving {} on {}/",
            store.display(),
            server.base
        )
    );
    assert!(
        said[1].starts_with(&format!(
            "layercache: log in at {}/login?token={token} (the token is kept in {}",
            server.base,
            token_file.display()
        )),
        "{said:?}"
    );
    let meta = std::fs::metadata(&token_file).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
        0o600
    );
    assert_eq!(
        std::fs::read_to_string(&token_file).unwrap(),
        format!("{token}\n")
    );
    assert_eq!(get_json(&server.addr, "/api/v1/projects").0, 401);
    // Opening the login URL sets the cookie and lands on a URL without the token.
    let login_path = server.login.trim_start_matches(&server.base);
    let r = request(&server.addr, "GET", login_path, &[], b"");
    assert_eq!((r.status, r.header("location")), (303, Some("/")));
    let cookie = r.header("set-cookie").unwrap().split(';').next().unwrap();
    assert!(!cookie.contains(&token), "{cookie}");
    let page = request(&server.addr, "GET", "/", &[("Cookie", cookie)], b"");
    assert_eq!(page.status, 200, "{}", page.text());
    assert!(page.text().contains(PROJECT), "{}", page.text());

    // Projects and caches agree with `layercache ls`.
    let (s, projects) = server.get_json("/api/v1/projects");
    assert_eq!(s, 200, "{projects}");
    let ls = lc_json(&store, &["ls", "--project", PROJECT]);
    let ls = ls.as_array().unwrap();
    let names: Vec<&str> = projects
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["project"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["other-demo", PROJECT], "{projects}");
    let web = &projects[1];
    assert_eq!(web["caches"], 2);
    assert_eq!(web["layers"], ls.len() as u64);
    assert_eq!(ls.len(), 4, "{ls:?}");
    let bytes: u64 = ls.iter().map(|l| l["bytes"].as_u64().unwrap()).sum();
    assert_eq!(web["bytes"], bytes);
    assert!(web["last_used"].as_str().unwrap().ends_with('Z'));
    assert_eq!(
        (&projects[0]["caches"], &projects[0]["layers"]),
        (&json!(1), &json!(1))
    );

    let (s, caches) = server.get_json("/api/v1/projects/web-demo/caches");
    assert_eq!(s, 200, "{caches}");
    for row in ls {
        let c = caches
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["cache"] == row["cache"])
            .unwrap();
        let l = c["layers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["layer"] == row["layer"])
            .unwrap_or_else(|| panic!("layer {} not listed: {c}", row["layer"]));
        assert_eq!(l["key"], row["keys"][0]);
        assert_eq!((&l["bytes"], &l["files"]), (&row["bytes"], &row["files"]));
        assert_eq!(l["in_use"], false);
        // Each key was hit once by the run after the one that filled it.
        assert_eq!(l["hits"], 1, "{l}");
    }

    // Runs: newest first, the saved time adds up to `stats`, which the API returns as is.
    let events: Vec<Value> = sb
        .events()
        .into_iter()
        .filter(|e| e["project"] == PROJECT)
        .collect();
    assert_eq!(events.len(), 8);
    let (s, runs) = server.get_json("/api/v1/projects/web-demo/runs");
    assert_eq!(s, 200, "{runs}");
    let runs = runs.as_array().unwrap().clone();
    assert_eq!(runs.len(), events.len());
    let times: Vec<u64> = runs
        .iter()
        .map(|r| r["time_ms"].as_u64().unwrap())
        .collect();
    assert!(times.windows(2).all(|w| w[0] >= w[1]), "{times:?}");
    // The two caches of one `layercache run` share its run id; runs differ.
    let ids: Vec<&str> = runs.iter().map(|r| r["run"].as_str().unwrap()).collect();
    assert_eq!(ids[0], ids[1], "{ids:?}");
    assert_ne!(ids[1], ids[2], "{ids:?}");
    assert_eq!(
        ids.iter().collect::<std::collections::BTreeSet<_>>().len(),
        4
    );
    let newest = events.last().unwrap();
    assert_eq!(runs[0]["key"], newest["key"]);
    let results: Vec<&str> = runs.iter().map(|r| r["result"].as_str().unwrap()).collect();
    assert_eq!(
        results.iter().filter(|r| **r == "miss").count(),
        2,
        "{results:?}"
    );
    assert!(results.contains(&"restore"), "{results:?}");
    let restore = runs.iter().find(|r| r["result"] == "restore").unwrap();
    assert_ne!(restore["matched_key"], restore["key"]);
    // One run (issue 24): its rows of the history, in run order, and the totals.
    let rid = restore["run"].as_str().unwrap();
    let (s, run) = server.get_json(&format!("/api/v1/projects/web-demo/runs/{rid}"));
    assert_eq!(s, 200, "{run}");
    let mut mine: Vec<Value> = runs.iter().filter(|r| r["run"] == rid).cloned().collect();
    mine.reverse();
    assert_eq!(run["caches"], json!(mine), "{run}");
    let total: u64 = mine.iter().map(|r| r["prep_ms"].as_u64().unwrap()).sum();
    assert_eq!(
        (run["run"].as_str(), run["prep_ms"].as_u64()),
        (Some(rid), Some(total))
    );
    assert_eq!(run["exit_status"], 0);
    let restored = run["caches"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["result"] == "restore")
        .unwrap();
    assert!(
        restored["why"][0]
            .as_str()
            .unwrap()
            .starts_with("nearest layer "),
        "{run}"
    );
    assert!(restored["new_files"].as_u64().unwrap() > 0, "{run}");
    let (s, e) = server.get_json("/api/v1/projects/web-demo/runs/000000000000-000000000000");
    assert_eq!(s, 404, "{e}");
    assert!(
        e["error"]
            .as_str()
            .unwrap()
            .contains("000000000000-000000000000"),
        "{e}"
    );
    // Not a run id at all (a path, here): 400, as for a bad project id.
    let (s, e) = server.get_json("/api/v1/projects/web-demo/runs/..%2F..%2Fetc");
    assert_eq!(s, 400, "{e}");
    assert!(
        e["error"].as_str().unwrap().contains("want 12 hex digits"),
        "{e}"
    );
    let stats = lc_json(&store, &["stats", "--project", PROJECT]);
    let saved: u64 = runs.iter().map(|r| r["saved_ms"].as_u64().unwrap()).sum();
    assert_eq!(saved, stats["saved_ms"].as_u64().unwrap());
    assert_eq!(
        server.get_json("/api/v1/projects/web-demo/stats"),
        (200, stats)
    );
    let (s, three) = server.get_json("/api/v1/projects/web-demo/runs?limit=3");
    assert_eq!((s, three.as_array().unwrap().len()), (200, 3));
    assert_eq!(three[0], runs[0]);
    let (s, e) = server.get_json("/api/v1/projects/web-demo/runs?limit=lots");
    assert_eq!(s, 400, "{e}");
    assert!(
        e["error"].as_str().unwrap().contains("limit \"lots\""),
        "{e}"
    );

    // Validation: the CLI's messages, by field; TOML or JSON by Content-Type.
    let r = server.request(
        "POST",
        "/api/v1/specs/validate",
        &[TOML],
        serve_support::SPEC.as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["ok"], true);
    let nm_keys = keys_of(&caches, "node_modules");
    let last_nm = events
        .iter()
        .rev()
        .find(|e| e["cache"] == "node_modules")
        .unwrap();
    assert_eq!(v["caches"][0]["id"], "node_modules");
    assert_eq!(v["caches"][0]["key"], last_nm["key"]);
    assert!(nm_keys.contains(&v["caches"][0]["key"].as_str().unwrap().to_string()));
    assert_eq!(v["caches"][0]["mountpoint"], "{workdir}/node_modules");
    assert_eq!(v["caches"][1]["mountpoint"], "/cache/npm");
    let prefix = v["caches"][1]["restore_keys"][0].as_str().unwrap();
    assert!(v["caches"][1]["key"].as_str().unwrap().starts_with(prefix) && prefix.ends_with('-'));
    let bad = "project = \"web-demo\"\n\n[[cache]]\nid = \"npm\"\npreset = \"nope\"\n";
    let r = server.request("POST", "/api/v1/specs/validate", &[TOML], bad.as_bytes());
    assert_eq!(r.status, 422, "{}", r.text());
    let v = r.json();
    assert_eq!(v["ok"], false);
    assert_eq!(v["errors"][0]["field"], "cache[0].preset");
    assert_eq!(v["errors"][0]["line"], 5);
    let bad_file = sb.write_spec("bad.toml", bad);
    let cli = Command::new(BIN)
        .args(["key", "--spec"])
        .arg(&bad_file)
        .output()
        .unwrap();
    assert_eq!(cli.status.code(), Some(2));
    let msg = v["errors"][0]["message"].as_str().unwrap();
    assert!(
        String::from_utf8_lossy(&cli.stderr).contains(msg),
        "CLI said {:?}, the API {msg:?}",
        String::from_utf8_lossy(&cli.stderr)
    );
    // Issue 24: what `layercache run` refuses the API refuses too (`mountpoint = "/etc"`),
    // and every bad field is listed, several of one cache included; run prints the same.
    let worse = "project = \"web-demo\"\n\n[[cache]]\nid = \"npm\"\npreset = \"npm\"\n\
                 mountpoint = \"/etc\"\nexclude = [\"/abs\"]\n\n[[cache]]\nid = \"a b\"\n\
                 setup = \"true\"\nkey_files = [\"x.lock\"]\n";
    let r = server.request("POST", "/api/v1/specs/validate", &[TOML], worse.as_bytes());
    assert_eq!(r.status, 422, "{}", r.text());
    let v = r.json();
    let fields: Vec<(&str, u64)> = (v["errors"].as_array().unwrap().iter())
        .map(|e| (e["field"].as_str().unwrap(), e["line"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        fields,
        [
            ("cache[0].mountpoint", 6),
            ("cache[0].exclude", 7),
            ("cache[1].id", 10)
        ],
        "{v}"
    );
    let worse_file = sb.write_spec("worse.toml", worse);
    let cli = Command::new(BIN)
        .arg("--store")
        .arg(&store)
        .args(["run", "--spec"])
        .arg(&worse_file)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(cli.status.code(), Some(2));
    let said = String::from_utf8_lossy(&cli.stderr);
    for e in v["errors"].as_array().unwrap() {
        let msg = e["message"].as_str().unwrap();
        assert!(said.contains(msg), "CLI said {said:?}, the API {msg:?}");
    }
    let r = server.request("POST",
        "/api/v1/specs/validate",
        &[("Content-Type", "application/json")],
        br#"{"project": "web-demo", "cache": [{"id": "x/y", "setup": "true", "key_files": ["a"]}]}"#,
    );
    assert_eq!(r.status, 422, "{}", r.text());
    assert_eq!(r.json()["errors"][0]["field"], "cache[0].id");
    let r = server.request(
        "POST",
        "/api/v1/specs/validate",
        &[("Content-Type", "application/json")],
        b"project = 1",
    );
    assert_eq!(
        (r.status, r.json()["errors"][0]["field"].clone()),
        (422, json!("body"))
    );
    let r = server.request(
        "POST",
        "/api/v1/specs/validate",
        &[("Content-Type", "image/png")],
        b"x",
    );
    assert_eq!(r.status, 415, "{}", r.text());

    // The stored spec: versioned in the project's directory, validated, never another project's.
    let (s, e) = server.get_json("/api/v1/projects/web-demo/spec");
    assert_eq!(s, 404, "{e}");
    let r = server.request(
        "PUT",
        "/api/v1/projects/web-demo/spec",
        &[TOML],
        serve_support::SPEC.as_bytes(),
    );
    assert_eq!(
        (r.status, r.json()["version"].clone()),
        (200, json!(1)),
        "{}",
        r.text()
    );
    let r = server.request(
        "PUT",
        "/api/v1/projects/web-demo/spec",
        &[TOML],
        bad.as_bytes(),
    );
    assert_eq!(
        (r.status, r.json()["errors"][0]["field"].clone()),
        (422, json!("cache[0].preset"))
    );
    let other = serve_support::SPEC.replace("web-demo", "other-project");
    let r = server.request(
        "PUT",
        "/api/v1/projects/web-demo/spec",
        &[TOML],
        other.as_bytes(),
    );
    assert_eq!(r.status, 422, "{}", r.text());
    assert_eq!(r.json()["errors"][0]["field"], "project");
    assert_eq!(r.json()["errors"][0]["line"], 1);
    let (s, cur) = server.get_json("/api/v1/projects/web-demo/spec");
    assert_eq!(s, 200, "{cur}");
    assert_eq!(
        (&cur["version"], &cur["versions"]),
        (&json!(1), &json!([1]))
    );
    assert_eq!(cur["spec"], serve_support::SPEC);
    let specs = store.join("v1/projects/web-demo/specs");
    assert_eq!(
        std::fs::read_to_string(specs.join("current")).unwrap(),
        "1.toml\n"
    );
    assert_eq!(
        std::fs::read_to_string(specs.join("1.toml")).unwrap(),
        serve_support::SPEC
    );
    assert!(!store.join("v1/projects/other-project").exists());

    // `layercache run --project P` runs the stored spec: both caches hit.
    let run = |args: &[&str]| {
        Command::new(BIN)
            .arg("--store")
            .arg(&store)
            .arg("run")
            .args(args)
            .arg("--workdir")
            .arg(sb.work())
            .arg("--mount-root")
            .arg(sb.path("cache"))
            .args(["--", "node", "-e", "console.log(require('ms')('1s'))"])
            .output()
            .unwrap()
    };
    let out = run(&["--project", PROJECT]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1000");
    // It says which stored version runs, and when that was saved, before anything runs.
    let saved = std::fs::metadata(specs.join("1.toml"))
        .unwrap()
        .modified()
        .unwrap();
    let saved = humantime::format_rfc3339_seconds(saved).to_string();
    assert_eq!(cur["saved"], saved.as_str(), "{cur}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let notice = format!(
        "layercache: using the stored spec of project {PROJECT}, version 1, saved {} UTC",
        saved.trim_end_matches('Z').replace('T', " ")
    );
    assert_eq!(stderr.lines().next(), Some(notice.as_str()), "{stderr}");
    let after: Vec<Value> = sb
        .events()
        .into_iter()
        .filter(|e| e["project"] == PROJECT)
        .collect();
    assert_eq!(after.len(), events.len() + 2);
    assert!(
        after[events.len()..].iter().all(|e| e["result"] == "hit"),
        "{after:?}"
    );
    let out = Command::new(BIN)
        .arg("--store")
        .arg(&store)
        .args(["--json", "run", "--project", PROJECT, "--workdir"])
        .arg(sb.work())
        .arg("--mount-root")
        .arg(sb.path("cache"))
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let summary: Value =
        serde_json::from_slice(out.stdout.split(|b| *b == b'\n').next().unwrap()).unwrap();
    assert_eq!(
        summary["stored_spec"],
        json!({"project": PROJECT, "version": 1, "saved": saved}),
        "{summary}"
    );
    let out = run(&["--project", "nope"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no such project"));

    // Unknown names: 404 with what exists; bad ids: 400 naming the id.
    let (s, e) = server.get_json("/api/v1/projects/nope/caches");
    assert_eq!(
        (s, &e["exists"]),
        (404, &json!(["other-demo", PROJECT])),
        "{e}"
    );
    let r = server.request("DELETE", "/api/v1/projects/web-demo/caches/pip", &[], b"");
    assert_eq!(
        (r.status, r.json()["exists"].clone()),
        (404, json!(["node_modules", "npm"]))
    );
    let r = server.request(
        "DELETE",
        "/api/v1/projects/web-demo/caches/npm/keys/npm-nope",
        &[],
        b"",
    );
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(r.json()["exists"].as_array().unwrap().len(), 2);
    for (path, what) in [
        ("/api/v1/projects/..%2Fother/caches", "project id"),
        ("/api/v1/projects/a%2Fb/runs", "project id"),
        ("/api/v1/projects/.hidden/stats", "project id"),
        ("/api/v1/projects/web-demo/caches/np%0Am", "cache id"),
    ] {
        let r = server.request(
            if path.contains("np%0A") {
                "DELETE"
            } else {
                "GET"
            },
            path,
            &[],
            b"",
        );
        assert_eq!(r.status, 400, "{path}: {}", r.text());
        assert!(
            r.json()["error"].as_str().unwrap().contains(what),
            "{path}: {}",
            r.text()
        );
    }

    // Clear of a layer in use: 409 naming it, nothing of it removed; cleared once unmounted.
    let npm_keys = keys_of(&caches, "npm");
    let key = npm_keys[0].clone();
    let mnt = sb.path("held");
    std::fs::create_dir(&mnt).unwrap();
    let held = Mounted {
        store: store.clone(),
        mnt: mnt.clone(),
    };
    let m = lc_json(
        &store,
        &[
            "mount",
            "--project",
            PROJECT,
            "--cache",
            "npm",
            "--key",
            &key,
            mnt.to_str().unwrap(),
        ],
    );
    assert_eq!(m["result"], "hit", "{m}");
    assert!(is_mounted(&mnt));
    let layer = m["layer"].as_str().unwrap().to_string();
    let (_, c) = server.get_json("/api/v1/projects/web-demo/caches");
    let in_use = c
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["layers"].as_array().unwrap().clone())
        .any(|l| l["key"] == key.as_str() && l["in_use"] == true);
    assert!(in_use, "{c}");
    let key_path = format!("/api/v1/projects/web-demo/caches/npm/keys/{key}");
    let r = server.request("DELETE", &key_path, &[], b"");
    assert_eq!(r.status, 409, "{}", r.text());
    assert_eq!(r.json()["in_use"], json!([layer]));
    assert!(
        store
            .join("v1/projects/web-demo/layers")
            .join(&layer)
            .is_dir()
    );
    let r = server.request("DELETE", "/api/v1/projects/web-demo/caches/npm", &[], b"");
    assert_eq!(r.status, 409, "{}", r.text());
    assert_eq!(r.json()["in_use"], json!([layer]));
    assert_eq!(
        r.json()["removed"].as_array().unwrap().len(),
        1,
        "{}",
        r.text()
    );
    assert_eq!(
        keys_of(
            &server.get_json("/api/v1/projects/web-demo/caches").1,
            "npm"
        ),
        vec![key.clone()]
    );
    // The page's clear button meets the same refusal and shows it (409).
    let form = format!("cache=npm&key={key}");
    let r = server.request(
        "POST",
        "/projects/web-demo/clear",
        &[
            ("Content-Type", "application/x-www-form-urlencoded"),
            ("Origin", &server.base),
        ],
        form.as_bytes(),
    );
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(
        r.text().contains("refused to clear 1 layer(s) in use"),
        "{}",
        r.text()
    );
    assert!(r.text().contains(&layer), "{}", r.text());
    drop(held);
    assert!(!is_mounted(&mnt));
    let r = server.request("DELETE", &key_path, &[], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["removed"], json!([layer]));
    assert!(
        keys_of(
            &server.get_json("/api/v1/projects/web-demo/caches").1,
            "npm"
        )
        .is_empty()
    );
    assert_eq!(
        lc_json(&store, &["ls", "--project", PROJECT])
            .as_array()
            .unwrap()
            .len(),
        2
    );

    // gc, as `layercache gc --json`.
    let r = server.request(
        "POST",
        "/api/v1/gc",
        &[("Content-Type", "application/json")],
        br#"{"dry_run": true}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["dry_run"], true);
    // Store-wide: web-demo's two layers and other-demo's.
    assert_eq!(r.json()["after"]["layers"], 3);
    let r = server.request("POST", "/api/v1/gc", &[], br#"{"max_size": "lots"}"#);
    assert_eq!(
        (r.status, r.json()["errors"][0]["field"].clone()),
        (422, json!("max_size"))
    );

    // Limits and origins.
    let big = vec![b'#'; 2 * 1024 * 1024];
    let r = server.request("POST", "/api/v1/specs/validate", &[TOML], &big);
    assert_eq!(r.status, 413);
    let r = server.request(
        "DELETE",
        "/api/v1/projects/web-demo/caches",
        &[("Origin", "http://evil.example")],
        b"",
    );
    assert_eq!(r.status, 403, "{}", r.text());
    let r = server.request(
        "DELETE",
        "/api/v1/projects/web-demo/caches",
        &[("Sec-Fetch-Site", "cross-site")],
        b"",
    );
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(
        lc_json(&store, &["ls", "--project", PROJECT])
            .as_array()
            .unwrap()
            .len(),
        2
    );
    let (s, doc) = server.get_json("/api/v1/openapi.json");
    assert_eq!(s, 200);
    validate_openapi(&doc, &sb.path("openapi.json"));
    assert!(
        doc["paths"]["/api/v1/projects/{project}/caches/{cache}/keys/{key}"]["delete"].is_object()
    );

    // SIGTERM: a graceful stop, exit 0.
    let status = server.stop();
    assert!(status.success(), "serve exited with {status}");
    // The next start reuses the store's token; the old session's cookie is refused.
    let server = Server::start(&store, &[]);
    assert_eq!(server.token.as_deref(), Some(token.as_str()));
    assert_eq!(server.token_file.as_deref(), Some(token_file.as_path()));
    let page = request(&server.addr, "GET", "/", &[("Cookie", cookie)], b"");
    assert_eq!(page.status, 401, "{}", page.text());
    assert_eq!(server.get_json("/api/v1/projects").0, 200);
    assert!(server.stop().success());

    // With a token: everything needs it; the login form sets the cookie.
    let token_file = sb.path("token");
    std::fs::write(&token_file, "s3cret-token-0123456789\n").unwrap();
    let private = std::os::unix::fs::PermissionsExt::from_mode(0o600);
    std::fs::set_permissions(&token_file, private).unwrap();
    let server = Server::start(&store, &["--token-file", token_file.to_str().unwrap()]);
    let a = server.addr.as_str();
    assert_eq!(request(a, "GET", "/api/v1/projects", &[], b"").status, 401);
    let wrong = request(
        a,
        "GET",
        "/api/v1/projects",
        &[("Authorization", "Bearer s3cret-token-0123456780")],
        b"",
    );
    assert_eq!(wrong.status, 401);
    assert!(
        wrong
            .header("www-authenticate")
            .unwrap()
            .starts_with("Bearer")
    );
    let ok = request(
        a,
        "GET",
        "/api/v1/projects",
        &[("Authorization", "Bearer s3cret-token-0123456789")],
        b"",
    );
    assert_eq!(ok.status, 200, "{}", ok.text());
    let r = request(a, "DELETE", "/api/v1/projects/web-demo/caches", &[], b"");
    assert_eq!(r.status, 401);
    // A page without the token: 401 with the login form, which returns to the page.
    let page = request(a, "GET", "/projects/web-demo", &[], b"");
    assert_eq!(page.status, 401);
    assert!(
        page.text().contains("value=\"/projects/web-demo\""),
        "{}",
        page.text()
    );
    // --token-file's token is never printed: the login line points at the form.
    assert_eq!(server.token, None);
    assert_eq!(server.login, format!("{}/login", server.base));
    let form = [("Content-Type", "application/x-www-form-urlencoded")];
    let r = request(
        a,
        "POST",
        "/login",
        &form,
        b"token=nope&next=%2Fprojects%2Fweb-demo",
    );
    assert_eq!(r.status, 401);
    let r = request(
        a,
        "POST",
        "/login",
        &form,
        b"token=s3cret-token-0123456789&next=%2Fprojects%2Fweb-demo",
    );
    assert_eq!(r.status, 303, "{}", r.text());
    let cookie = r
        .header("set-cookie")
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    assert!(r.header("set-cookie").unwrap().contains("HttpOnly"));
    let page = request(a, "GET", "/projects/web-demo", &[("Cookie", &cookie)], b"");
    assert_eq!(page.status, 200);
    assert!(page.text().contains("node_modules"), "{}", page.text());
    // Every answer, page or error, forbids scripts, framing and sniffing.
    for r in [&page, &wrong] {
        let csp = r.header("content-security-policy").unwrap_or_default();
        assert!(csp.contains("default-src 'none'"), "{csp:?}");
        assert!(csp.contains("frame-ancestors 'none'"), "{csp:?}");
        assert_eq!(r.header("x-frame-options"), Some("DENY"));
        assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
    }

    // Clearing all of web-demo leaves other-demo's layer (same lockfile, but each project's
    // keys are keyed with its own salt, so the two never share a key).
    let bearer = [("Authorization", "Bearer s3cret-token-0123456789")];
    let r = request(
        a,
        "DELETE",
        "/api/v1/projects/web-demo/caches",
        &bearer,
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["removed"].as_array().unwrap().len(), 2);
    // SIGINT (Ctrl-C) stops it gracefully too.
    let status = server.stop_with(libc::SIGINT);
    assert!(status.success(), "serve exited with {status} on SIGINT");
    // A cleared project's directory goes with it (issue 11): the store no longer knows it.
    assert!(!store.join("v1/projects").join(PROJECT).exists());
    let theirs = lc_json(&store, &["ls", "--project", "other-demo"]);
    assert_eq!(theirs.as_array().unwrap().len(), 1, "{theirs}");
    assert!(
        !nm_keys.contains(&theirs[0]["keys"][0].as_str().unwrap().to_string()),
        "{theirs}"
    );
}

/// Whether a test can run commands as another local user (setpriv, and useradd to make one);
/// otherwise a skip (a failure with `CI`).
fn can_act_as_another_user() -> bool {
    let has_useradd = Command::new("sh")
        .args(["-c", "command -v useradd"])
        .output()
        .is_ok_and(|o| o.status.success());
    have_tool("setpriv")
        && (has_useradd || !skip_or_fail("needs useradd (Debian's passwd package)"))
}

/// A sandbox other users may enter (0755) whose workdir has `deps.lock` and a spec of
/// `project` with one cache, `deps`, that setup fills with a file; returns it and the spec.
fn sandbox_others_reach(project: &str) -> (Sandbox, std::path::PathBuf) {
    let sb = Sandbox::new();
    let open = std::os::unix::fs::PermissionsExt::from_mode(0o755);
    std::fs::set_permissions(sb.path(""), open).unwrap();
    std::fs::write(sb.work().join("deps.lock"), "a=1\n").unwrap();
    let spec = sb.write_spec(
        "spec.toml",
        &format!(
            "project = \"{project}\"\n\n[[cache]]\nid = \"deps\"\nkey_files = [\"deps.lock\"]\n\
             setup = \"echo filled > {{mount}}/f\"\n"
        ),
    );
    (sb, spec)
}

/// Listening off loopback without a token is refused (exit 2, nothing served); a weak token
/// file too.
#[test]
fn serve_refuses_a_non_loopback_address_without_a_token() {
    let t = tempfile::tempdir().unwrap();
    let lc = |args: &[&str]| {
        Command::new(BIN)
            .arg("--store")
            .arg(t.path())
            .arg("serve")
            .args(args)
            .output()
            .unwrap()
    };
    let out = lc(&["--listen", "0.0.0.0:0"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--token-file") && err.contains("0.0.0.0:0"),
        "{err}"
    );
    let weak = t.path().join("weak");
    std::fs::write(&weak, "short\n").unwrap();
    let private = std::os::unix::fs::PermissionsExt::from_mode(0o600);
    std::fs::set_permissions(&weak, private).unwrap();
    let out = lc(&[
        "--listen",
        "0.0.0.0:0",
        "--token-file",
        weak.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least 16"));
    // A good token in a file others can read is refused, naming the file and the fix.
    let open = t.path().join("open");
    std::fs::write(&open, "s3cret-token-0123456789\n").unwrap();
    let readable = std::os::unix::fs::PermissionsExt::from_mode(0o644);
    std::fs::set_permissions(&open, readable).unwrap();
    let out = lc(&["--token-file", open.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("open") && err.contains("chmod 600"), "{err}");
    // No store there: refused without creating one.
    let out = lc(&[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(!Path::new(t.path()).join("v1").exists());
}

/// Issue 29 item 1: root serves its store with the defaults (loopback, no --token-file); another
/// local user can reach the token file by path but not read it, gets 401 from every route it
/// tries — the API (list, plant a spec, clear, gc), the pages and their forms, a guessed login
/// URL or cookie — and nothing is stored or removed; it cannot serve root's store itself either.
/// Root, with the token, still gets in.
#[test]
fn another_local_user_gets_401_everywhere_and_cannot_read_the_token() {
    if !can_mount() || !have_tool("curl") || !can_act_as_another_user() {
        return;
    }
    let user = test_user();
    // Only the store's own modes stand between the user and the token file.
    let (sb, spec) = sandbox_others_reach("private-demo");
    assert_eq!(sb.run(&spec, None).status.code(), Some(0));
    let store = sb.path("store");
    let layers = |store: &Path| lc_json(store, &["ls"]).as_array().unwrap().len();
    assert_eq!(layers(&store), 1);
    let server = Server::start(&store, &[]);
    let token = server.token.clone().unwrap();

    // The token file is there (the user can see it) but only root may read it.
    let token_file = store.join("v1/serve-token");
    let tf = token_file.to_str().unwrap();
    assert!(as_user(user, &["test", "-e", tf]).status.success());
    let cat = as_user(user, &["cat", tf]);
    assert!(!cat.status.success());
    let err = String::from_utf8_lossy(&cat.stderr);
    assert!(err.contains("Permission denied"), "{err}");
    assert!(!String::from_utf8_lossy(&cat.stdout).contains(&token));

    let planted = "project = \"private-demo\"\n\n[[cache]]\nid = \"deps\"\n\
                   key_files = [\"deps.lock\"]\nsetup = \"true\"\nmaintenance = \"id > /tmp/pwned\"\n";
    let cookie = format!(
        "Cookie: layercache_session_{}={}",
        server.addr.rsplit(':').next().unwrap(),
        "0".repeat(64)
    );
    let url = |path: &str| format!("{}{path}", server.base);
    let tries: Vec<(&str, String, Vec<String>)> = vec![
        ("GET", url("/api/v1/projects"), vec![]),
        ("GET", url("/api/v1/projects/private-demo/caches"), vec![]),
        ("GET", url("/api/v1/projects/private-demo/runs"), vec![]),
        ("GET", url("/api/v1/openapi.json"), vec![]),
        (
            "PUT",
            url("/api/v1/projects/private-demo/spec"),
            vec![
                "-H".into(),
                "Content-Type: application/toml".into(),
                "--data-binary".into(),
                planted.into(),
            ],
        ),
        (
            "DELETE",
            url("/api/v1/projects/private-demo/caches"),
            vec![],
        ),
        (
            "DELETE",
            url("/api/v1/projects/private-demo/caches/deps"),
            vec![],
        ),
        (
            "POST",
            url("/api/v1/gc"),
            vec!["--data-binary".into(), "{}".into()],
        ),
        ("GET", url("/"), vec![]),
        ("GET", url("/projects/private-demo"), vec![]),
        ("GET", url("/projects/private-demo/spec"), vec![]),
        (
            "POST",
            url("/projects/private-demo/clear"),
            vec!["--data".into(), "cache=deps".into()],
        ),
        (
            "POST",
            url("/projects/private-demo/spec"),
            vec!["--data-urlencode".into(), format!("spec={planted}")],
        ),
        (
            "GET",
            url("/api/v1/projects"),
            vec!["-H".into(), cookie.clone()],
        ),
        ("GET", url("/"), vec!["-H".into(), cookie.clone()]),
        (
            "GET",
            url("/api/v1/projects"),
            vec![
                "-H".into(),
                format!("Authorization: Bearer {}", "0".repeat(64)),
            ],
        ),
        (
            "GET",
            url(&format!("/login?token={}", "0".repeat(64))),
            vec![],
        ),
    ];
    for (method, u, extra) in &tries {
        let mut argv = vec![
            "curl",
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-X",
            method,
        ];
        argv.extend(extra.iter().map(String::as_str));
        argv.push(u);
        let out = as_user(user, &argv);
        let code = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            code,
            "401",
            "{method} {u} {extra:?} as uid {}: {}",
            user.0,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Nothing was stored or removed.
    assert!(!store.join("v1/projects/private-demo/specs").exists());
    assert_eq!(layers(&store), 1);
    let out = Command::new(BIN)
        .arg("--store")
        .arg(&store)
        .args(["run", "--project", "private-demo", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no stored spec"));
    // Serving root's store as the user is refused before anything listens.
    let own = as_user(
        user,
        &[
            BIN,
            "--store",
            store.to_str().unwrap(),
            "serve",
            "--listen",
            "127.0.0.1:0",
        ],
    );
    assert_eq!(own.status.code(), Some(2), "{own:?}");
    let err = String::from_utf8_lossy(&own.stderr);
    assert!(err.contains("store's owner or root"), "{err}");
    // Root, with the token, gets in.
    let (s, projects) = server.get_json("/api/v1/projects");
    assert_eq!(s, 200, "{projects}");
    assert_eq!(projects[0]["layers"], 1, "{projects}");
    assert!(server.stop().success());
}

/// Serving one loopback address holds the other family's loopback on the same port too
/// (`[::1]:P` beside `127.0.0.1:P`, and the reverse), so no other local process can listen
/// there for clients that resolve `localhost` to it and receive their token; the server
/// answers there with the same token; and when another process already holds that port,
/// serve does not start, naming it. A skip on a host without IPv6 loopback.
#[test]
fn serve_holds_the_other_loopback_family_too() {
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        eprintln!("skipped: this host has no IPv6 loopback ([::1])");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    layercache::store::Store::open(Some(&store)).unwrap();
    let port_of = |addr: &str| -> u16 { addr.rsplit(':').next().unwrap().parse().unwrap() };
    for (listen, other) in [("127.0.0.1:0", "::1"), ("[::1]:0", "127.0.0.1")] {
        let server = Server::start_on(&store, listen, &[]);
        let port = port_of(&server.addr);
        let e = std::net::TcpListener::bind((other, port)).unwrap_err();
        assert_eq!(
            e.raw_os_error(),
            Some(libc::EADDRINUSE),
            "{other} port {port} beside {}: {e}",
            server.addr
        );
        // The server itself answers there, to the same token only.
        let there = if other == "::1" {
            format!("[::1]:{port}")
        } else {
            format!("127.0.0.1:{port}")
        };
        let bearer = format!("Bearer {}", server.token.as_deref().unwrap());
        let r = request(
            &there,
            "GET",
            "/api/v1/projects",
            &[("Authorization", &bearer)],
            b"",
        );
        assert_eq!(r.status, 200, "{there}");
        assert_eq!(
            request(&there, "GET", "/api/v1/projects", &[], b"").status,
            401
        );
        assert!(server.stop().success());
    }
    // Someone else holds [::1]:P first: serve on 127.0.0.1:P refuses, naming it.
    let held = std::net::TcpListener::bind("[::1]:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let out = Command::new(BIN)
        .arg("--store")
        .arg(&store)
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("[::1]:{port}")) && err.contains("already in use"),
        "{err}"
    );
    drop(held);
}

/// The review's reproduction of a swapped store: root makes its store under umask 000 and
/// another local user tries to rename its `v1/` and plant their own. The root is 0755 whatever
/// the umask, so the rename fails; and a `v1/` of that user put there anyway (as a store made
/// by an older version allowed) is refused by root's `serve` and `run --project` (exit 2): no
/// token is made for that user and the planted spec never runs.
#[test]
fn a_store_made_under_umask_000_cannot_be_swapped_by_another_user() {
    if !can_mount() || !can_act_as_another_user() {
        return;
    }
    let user = test_user();
    let (sb, spec) = sandbox_others_reach("rtp");
    let store = sb.path("store");
    let cache = sb.path("cache");
    let out = Command::new("sh")
        .args(["-c", "umask 000 && exec \"$@\"", "sh", BIN, "--store"])
        .arg(&store)
        .args(["run", "--spec"])
        .arg(&spec)
        .arg("--workdir")
        .arg(sb.work())
        .arg("--mount-root")
        .arg(&cache)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mode = |p: &Path| std::os::unix::fs::MetadataExt::mode(&std::fs::metadata(p).unwrap());
    assert_eq!(mode(&store) & 0o7777, 0o755);
    assert_eq!(mode(&store.join("v1")) & 0o7777, 0o755);
    let (v1, old) = (store.join("v1"), store.join("v1.old"));
    let mv = as_user(user, &["mv", v1.to_str().unwrap(), old.to_str().unwrap()]);
    assert!(!mv.status.success());
    assert!(v1.join("format.json").is_file() && !old.exists());

    // The user's v1 in the store's place anyway (root moves it for them here).
    std::fs::rename(&v1, &old).unwrap();
    let specs = v1.join("projects/rtp/specs");
    std::fs::create_dir_all(&specs).unwrap();
    std::fs::copy(old.join("format.json"), v1.join("format.json")).unwrap();
    let marker = sb.path("pwned");
    std::fs::write(
        specs.join("1.toml"),
        format!(
            "project = \"rtp\"\n\n[[cache]]\nid = \"deps\"\nkey_files = [\"deps.lock\"]\n\
             setup = \"id > {}\"\n",
            marker.display()
        ),
    )
    .unwrap();
    std::fs::write(specs.join("current"), "1.toml\n").unwrap();
    let chown = Command::new("chown")
        .args(["-R", &format!("{}:{}", user.0, user.1)])
        .arg(&v1)
        .output()
        .unwrap();
    assert!(chown.status.success());
    let lc = |args: &[&str]| {
        Command::new(BIN)
            .arg("--store")
            .arg(&store)
            .args(args)
            .current_dir(sb.work())
            .output()
            .unwrap()
    };
    let out = lc(&["serve", "--listen", "127.0.0.1:0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!("belongs to uid {}", user.0)) && err.contains("v1"),
        "{err}"
    );
    assert!(!v1.join("serve-token").exists());
    let out = lc(&[
        "run",
        "--project",
        "rtp",
        "--mount-root",
        cache.to_str().unwrap(),
        "--",
        "true",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(&format!("uid {}", user.0)), "{err}");
    assert!(!marker.exists());
}
