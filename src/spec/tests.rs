use super::template::*;
use super::*;

fn err(text: &str) -> String {
    parse(text).unwrap_err().to_string()
}

#[test]
fn parses_the_issue_example() {
    let s = parse(
        r#"project = "acme-web"
[[cache]]
id = "npm"
preset = "npm"
setup = "npm ci"
maintenance = "npm ci --prefer-offline"
"#,
    )
    .unwrap();
    assert_eq!(s.project.as_str(), "acme-web");
    let c = &s.caches[0];
    assert_eq!(c.setup, "npm ci");
    assert_eq!(c.maintenance.as_deref(), Some("npm ci --prefer-offline"));
    assert_eq!(c.key_files, ["package-lock.json", "npm-shrinkwrap.json"]);
    assert!(!c.key_files_explicit);
    assert_eq!(c.env["npm_config_cache"], "{mount}");
    assert_eq!(c.tools(), ["node"]);
}

#[test]
fn json_is_accepted_too() {
    let s = parse(r#"{"project":"p","cache":[{"id":"nm","preset":"node_modules"}]}"#).unwrap();
    let paths = Paths {
        workdir: "/w".into(),
        mount_root: "/cache".into(),
        workdir_view: None,
    };
    assert_eq!(
        s.caches[0].mountpoint(&paths).unwrap(),
        Path::new("/w/node_modules")
    );
    assert!(s.caches[0].maintenance.is_none());
}

#[test]
fn mountpoints_stay_below_the_mount_root_or_the_workdir() {
    let paths = Paths {
        workdir: "/w".into(),
        mount_root: "/cache".into(),
        workdir_view: None,
    };
    // Refused when the spec is read (no paths needed: no mount root or workdir holds them),
    // by `layercache run` and the API alike.
    for mp in [
        "/etc",
        "/",
        "/usr/lib",
        "/proc/x",
        "/tmp",
        "/etc/{env:HOME}",
        "{workdir}",
        "{mount_root}/",
    ] {
        let e = err(&format!(
            "project = \"p\"\n[[cache]]\nid = \"a\"\npreset = \"npm\"\nmountpoint = \"{mp}\"\n"
        ));
        assert!(e.contains("cache[0].mountpoint"), "{mp}: {e}");
    }
    // Refused when the run's paths are known.
    for mp in ["/cache", "/w", "/elsewhere/x"] {
        let s = parse(&format!(
            "project = \"p\"\n[[cache]]\nid = \"a\"\npreset = \"npm\"\nmountpoint = \"{mp}\"\n"
        ))
        .unwrap();
        let e = s.caches[0].mountpoint(&paths).unwrap_err().to_string();
        assert!(
            e.contains("cache \"a\"") && e.contains("mountpoint"),
            "{mp}: {e}"
        );
    }
    assert!(check_root("--mount-root", Path::new("/etc")).is_err());
    assert!(check_root("--mount-root", Path::new("/")).is_err());
    assert!(check_root("--mount-root", Path::new("/proc/1")).is_err());
    assert!(check_root("--mount-root", Path::new("/cache")).is_ok());
    assert!(check_root("--workdir", Path::new("/tmp/x y")).is_ok());
}

#[test]
fn user_is_checked_for_syntax_and_kept() {
    let s = parse("user = \"1000:1000\"\nproject = \"p\"\n").unwrap();
    assert_eq!(s.user.as_deref(), Some("1000:1000"));
    assert_eq!(parse("project = \"p\"\n").unwrap().user, None);
    let e = parse("user = \"a;b\"\nproject = \"p\"\n").unwrap_err();
    assert!(e.to_string().starts_with("user: "), "{e}");
}

#[test]
fn an_integer_user_is_a_uid_and_a_bad_one_is_one_line() {
    // TOML and JSON: `user = 1000` is `--user 1000`.
    let s = parse("user = 1000\nproject = \"p\"\n").unwrap();
    assert_eq!(s.user.as_deref(), Some("1000"));
    let s = parse(r#"{"project": "p", "user": 0}"#).unwrap();
    assert_eq!(s.user.as_deref(), Some("0"));
    for bad in ["-1", "4294967295", "99999999999"] {
        let e = parse(&format!("user = {bad}\nproject = \"p\"\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("user: ") && e.contains("0 to 4294967294") && e.lines().count() == 1,
            "{bad}: {e}"
        );
    }
}

#[test]
fn passthrough_is_per_cache_and_auto_by_default() {
    use crate::overlay::options::PassthroughChoice;
    let s = parse(
        "project = \"p\"\n[[cache]]\nid = \"a\"\npreset = \"npm\"\n\
         [[cache]]\nid = \"b\"\npreset = \"venv\"\npassthrough = \"on\"\n",
    )
    .unwrap();
    assert_eq!(s.caches[0].passthrough, PassthroughChoice::Auto);
    assert_eq!(s.caches[1].passthrough, PassthroughChoice::On);
    let e =
        err("project = \"p\"\n[[cache]]\nid = \"a\"\npreset = \"npm\"\npassthrough = \"yes\"\n");
    assert!(
        e.contains("cache[0].passthrough") && e.contains("want auto, on or off"),
        "{e}"
    );
}

#[test]
fn no_caches_is_valid() {
    assert!(parse("project = \"p\"\n").unwrap().caches.is_empty());
}

#[test]
fn bad_specs_name_the_field() {
    let e = err("project = \"p\"\n[[cache]]\nid = \"x\"\npreset = \"nmp\"\n");
    assert!(e.contains("cache[0].preset") && e.contains("nmp"), "{e}");
    let e = err("project = \"p\"\n[[cache]]\nid = \"a/b\"\npreset = \"npm\"\n");
    assert!(e.contains("cache[0].id"), "{e}");
    let e = err(
        "project = \"p\"\n[[cache]]\nid = \"a\"\npreset = \"npm\"\n[[cache]]\nid = \"a\"\npreset = \"pip\"\n",
    );
    assert!(e.contains("cache[1].id") && e.contains("duplicate"), "{e}");
    let e = err("project = \"p\"\n[[cache]]\nid = \"a\"\npreset = \"npm\"\nsetp = \"x\"\n");
    assert!(e.contains("setp"), "{e}");
    let e = err("project = \"p\"\nfoo = 1\n");
    assert!(e.contains("foo"), "{e}");
    let e = err("project = \"../x\"\n");
    assert!(e.contains("project"), "{e}");
    let e = err("project = \"p\"\n[[cache]]\nid = \"a\"\nkey_files = [\"x.lock\"]\n");
    assert!(e.contains("cache[0].setup"), "{e}");
    let e = err("project = \"p\"\n[[cache]]\nid = \"a\"\nsetup = \"true\"\n");
    assert!(e.contains("cache[0].key_files"), "{e}");
    let e = err(
        "project = \"p\"\n[[cache]]\nid = \"a\"\npreset = \"npm\"\nkey_files = [\"../etc/passwd\"]\n",
    );
    assert!(e.contains("cache[0].key_files"), "{e}");
    let e = err(
        "project = \"p\"\n[[cache]]\nid = \"a\"\npreset = \"npm\"\nenv = { \"A-B\" = \"x\" }\n",
    );
    assert!(e.contains("cache[0].env"), "{e}");
    let e = err("project = \"p\"\n[[cache]]\nid = \"a\"\npreset = \"npm\"\nmountpoint = \"rel\"\n");
    assert!(e.contains("cache[0].mountpoint"), "{e}");
    let e =
        err("project = \"p\"\n[[cache]]\nid = \"a\"\npreset = \"npm\"\nrestore_keys = [\"a b\"]\n");
    assert!(e.contains("cache[0].restore_keys"), "{e}");
    let e = err(r#"{"project":"p","cache":[{"id":"a","preset":"npm","bogus":1}]}"#);
    assert!(e.contains("bogus"), "{e}");
    let e =
        err("project = \"p\"\n[[cache]]\nid = \"a\"\npreset = \"npm\"\nsetup = \"cp x {mnt}\"\n");
    assert!(e.contains("cache[0].setup") && e.contains("{mnt}"), "{e}");
}

#[test]
fn presets_match_the_issue() {
    let names: Vec<&str> = PRESETS.iter().map(|p| p.name).collect();
    assert_eq!(
        names,
        [
            "npm",
            "pnpm",
            "yarn",
            "pip",
            "uv",
            "go",
            "cargo",
            "maven",
            "gradle",
            "node_modules",
            "venv",
            "cargo-target"
        ]
    );
    let env = |n: &str| {
        preset(n)
            .unwrap()
            .env
            .iter()
            .map(|(k, _)| *k)
            .collect::<Vec<_>>()
    };
    assert_eq!(env("npm"), ["npm_config_cache"]);
    assert_eq!(env("pnpm"), ["npm_config_store_dir"]);
    assert_eq!(env("yarn"), ["YARN_CACHE_FOLDER"]);
    assert_eq!(env("pip"), ["PIP_CACHE_DIR"]);
    assert_eq!(env("uv"), ["UV_CACHE_DIR", "UV_LINK_MODE"]);
    assert_eq!(env("go"), ["GOMODCACHE", "GOCACHE"]);
    assert_eq!(env("cargo"), ["CARGO_HOME"]);
    assert_eq!(env("gradle"), ["GRADLE_USER_HOME"]);
    assert_eq!(env("cargo-target"), ["CARGO_TARGET_DIR"]);
    assert!(
        preset("maven").unwrap().env[0]
            .1
            .contains("maven.repo.local")
    );
    assert_eq!(preset("venv").unwrap().mountpoint, Some("{workdir}/.venv"));
    for p in PRESETS {
        assert!(!p.tools.is_empty() && !p.key_files.is_empty(), "{}", p.name);
        assert!(presets_text(false).contains(p.name));
    }
    let v: serde_json::Value = serde_json::from_str(&presets_text(true)).unwrap();
    assert_eq!(v.as_array().unwrap().len(), PRESETS.len());
    let venv = v.as_array().unwrap().iter().find(|p| p["name"] == "venv");
    assert_eq!(venv.unwrap()["relocatable"], false);
    let cargo = v.as_array().unwrap().iter().find(|p| p["name"] == "cargo");
    assert!(cargo.unwrap()["exclude"].as_array().unwrap().len() > 1);
}

#[test]
fn restore_setup_follows_the_setup() {
    let c = |extra: &str| {
        parse(&format!(
            "project = \"p\"\n[[cache]]\nid = \"nm\"\npreset = \"node_modules\"\n{extra}"
        ))
        .map(|s| s.caches[0].restore_setup.clone())
    };
    // The preset's incremental install on a restore, unless the spec's own setup replaces
    // the preset's (then that setup runs on a restore too) or the spec names one.
    assert!(
        c("")
            .unwrap()
            .unwrap()
            .contains("npm install --prefer-offline")
    );
    assert_eq!(c("setup = \"npm ci\"\n").unwrap(), None);
    assert_eq!(
        c("restore_setup = \"npm i\"\n").unwrap().as_deref(),
        Some("npm i")
    );
    let e = c("restore_setup = \" \"\n").unwrap_err().to_string();
    assert!(e.contains("cache[0].restore_setup"), "{e}");
    // A hit of a download cache never reinstalls a tree that another cache mounts.
    for name in ["npm", "pnpm", "yarn", "uv"] {
        let m = preset(name).unwrap().maintenance.unwrap();
        assert!(m.starts_with("mountpoint -q "), "{name}: {m}");
    }
    // pip's cache preset installs nothing anywhere: it only downloads into its cache.
    let pip = preset("pip").unwrap();
    assert_eq!(pip.maintenance, None);
    assert!(pip.setup.contains("pip download") && !pip.setup.contains("pip install"));
    assert!(!presets::VENV_RESTORE.contains('{') && !presets::VENV_RESTORE.contains('}'));
}

#[test]
fn every_bad_field_is_reported_in_spec_order() {
    let text = "project = \"a/b\"\n[[cache]]\nid = \"x\"\npreset = \"nope\"\n\
                [[cache]]\nid = \"ok\"\npreset = \"npm\"\n\
                [[cache]]\nid = \"y\"\nkey_files = [\"a.lock\"]\n\
                [[cache]]\nid = \"ok\"\npreset = \"pip\"\n";
    let errors = parse_all(text).unwrap_err();
    assert_eq!(errors.len(), 4, "{errors:#?}");
    assert!(errors[0].starts_with("project: "), "{errors:#?}");
    assert!(errors[1].starts_with("cache[0].preset: unknown preset"));
    assert!(errors[2].starts_with("cache[2].setup: missing"));
    // The duplicate names the index in the spec, though an invalid cache came before it.
    assert!(errors[3].contains("also cache[1].id"), "{errors:#?}");
    assert_eq!(parse(text).unwrap_err().to_string(), errors.join("\n"));
    // A syntax error is one message of one line, with its line and column.
    let syntax = parse_all("project = \"p\"\n[[cache]]\nid = \"a\"\nsetup = \n").unwrap_err();
    assert_eq!(syntax.len(), 1, "{syntax:?}");
    assert!(!syntax[0].contains('\n'), "{syntax:?}");
    assert!(
        syntax[0].starts_with("TOML syntax error at line 4, column 9: "),
        "{syntax:?}"
    );
}

#[test]
fn a_type_error_hides_no_other_error() {
    // cache[0] has two fields of the wrong type and an unknown one; cache[1] an unknown
    // preset; the project is an integer: every one is reported, each on one line.
    let text = "project = 5\n[[cache]]\nid = \"a\"\nsetup = 5\nkey_files = \"x\"\nbogus = 1\n\
                [[cache]]\nid = \"b\"\npreset = \"nope\"\n";
    let errors = parse_all(text).unwrap_err();
    let heads: Vec<&str> = errors
        .iter()
        .map(|e| e.split_once(": ").unwrap().0)
        .collect();
    assert_eq!(
        heads,
        [
            "project",
            "cache[0].bogus",
            "cache[0].key_files",
            "cache[0].setup",
            "cache[1].preset"
        ],
        "{errors:#?}"
    );
    assert!(errors.iter().all(|e| !e.contains('\n')), "{errors:#?}");
    assert!(errors[0].contains("expected a string"), "{errors:#?}");
    assert!(errors[1].contains("unknown field `bogus`"), "{errors:#?}");
    assert!(errors[3].contains("integer `5`"), "{errors:#?}");
    // The same in JSON; a missing id is named; a good cache beside bad ones still parses.
    let json =
        r#"{"project": "p", "cache": [{"setup": 5}, {"id": "b", "preset": "npm", "env": 1}]}"#;
    let errors = parse_all(json).unwrap_err();
    let heads: Vec<&str> = errors
        .iter()
        .map(|e| e.split_once(": ").unwrap().0)
        .collect();
    assert_eq!(
        heads,
        ["cache[0].setup", "cache[0].id", "cache[1].env"],
        "{errors:#?}"
    );
    // An unknown top-level field beside a good spec.
    let errors = parse_all("project = \"p\"\nprojekt = 1\n").unwrap_err();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with("projekt: unknown field"),
        "{errors:?}"
    );
    assert!(parse_all("project = \"p\"\n[[caches]]\nid = \"a\"\npreset = \"npm\"\n").is_ok());
}

/// A misspelt field is named with its line and what it likely is, and the checks of the field
/// it stands for (`key_files: missing`; a preset's `setup` and `key_files`) are not repeated;
/// a field nothing resembles keeps serde's message, with its line.
#[test]
fn a_misspelt_field_says_its_line_and_what_was_meant_once() {
    let text =
        "project = \"p\"\n[[cache]]\nid = \"a\"\nkey_file = [\"x.lock\"]\nsetup = \"true\"\n";
    let errors = parse_all(text).unwrap_err();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        errors[0].starts_with(
            "cache[0].key_file: unknown field `key_file` at line 4, did you mean `key_files`?"
        ),
        "{errors:#?}"
    );
    let text = "project = \"p\"\n[[cache]]\nid = \"a\"\n[[cache]]\nid = \"b\"\nprest = \"npm\"\n";
    let errors = parse_all(text).unwrap_err();
    // cache[0] lacks setup and key_files; cache[1]'s are a preset's, which it misspelt.
    assert_eq!(errors.len(), 3, "{errors:#?}");
    assert!(
        errors[0].starts_with("cache[0].setup: missing"),
        "{errors:#?}"
    );
    assert!(
        errors[2]
            .starts_with("cache[1].prest: unknown field `prest` at line 6, did you mean `preset`?"),
        "{errors:#?}"
    );
    let errors = parse_all("projekt = \"p\"\n").unwrap_err();
    assert_eq!(
        errors,
        [
            "projekt: unknown field at line 1 (did you mean `project`? a spec has project, user and \
          [[cache]] tables)"
        ]
    );
    let errors = parse_all("project = \"p\"\n[[cache]]\nid = \"a\"\npreset = \"npm\"\nzzz = 1\n")
        .unwrap_err();
    assert!(
        errors[0].starts_with("cache[0].zzz: unknown field `zzz` at line 5, expected one of"),
        "{errors:#?}"
    );
}

/// [`super::parse::CACHE_FIELDS`] is what serde knows of a cache.
#[test]
fn the_cache_fields_listed_are_serdes() {
    let errors = parse_all("project = \"p\"\n[[cache]]\nid = \"a\"\npreset = \"npm\"\nzzz = 1\n")
        .unwrap_err();
    let listed = errors[0].split_once("expected one of ").unwrap().1;
    let serde: Vec<&str> = listed.split(", ").map(|f| f.trim_matches('`')).collect();
    assert_eq!(serde, super::parse::CACHE_FIELDS);
}

#[test]
fn templates_expand() {
    let mut paths = Paths {
        workdir: "/w".into(),
        mount_root: "/c".into(),
        workdir_view: None,
    };
    let m = Path::new("/c/x");
    assert_eq!(expand("{mount}/mod", &paths, Some(m)), "/c/x/mod");
    assert_eq!(expand("{workdir}:{mount_root}", &paths, None), "/w:/c");
    assert_eq!(expand("{unknown} {", &paths, None), "{unknown} {");
    assert_eq!(
        expand("${HOME} {{mount}}", &paths, Some(m)),
        "${HOME} {mount}"
    );
    paths.workdir_view = Some("/workspace".into());
    assert_eq!(expand("{workdir}", &paths, None), "/workspace");
    // In scripts every value is one shell word, whatever it holds.
    let odd = Path::new("/c/a b/$(touch x)");
    assert_eq!(
        expand_script("ls {mount}/f", &paths, Some(odd)),
        "ls '/c/a b/$(touch x)'/f"
    );
    assert!(check_templates("echo {mount} ${X} {{x}} {env:HOME}").is_ok());
    let e = check_templates("echo {mnt}").unwrap_err();
    assert!(e.contains("{mnt}") && e.contains("{mount}"), "{e}");
    assert_eq!(
        expand("{env:LAYERCACHE_SURELY_UNSET_VAR}x", &paths, None),
        "x"
    );
}

/// Every bad field is listed, several of one cache included, not only the first.
#[test]
fn every_bad_field_is_listed() {
    let errors = parse_all(
        "project = \"p q\"\n[[cache]]\nid = \"a\"\npreset = \"npm\"\nmountpoint = \"/etc\"\n\
         env = { \"1X\" = \"y\" }\nsetup = \"echo {nope}\"\n[[cache]]\nid = \"b/c\"\n\
         preset = \"nope\"\n",
    )
    .unwrap_err();
    let fields: Vec<&str> = errors
        .iter()
        .map(|e| e.split_once(": ").unwrap().0)
        .collect();
    assert_eq!(
        fields,
        [
            "project",
            "cache[0].env",
            "cache[0].mountpoint",
            "cache[0].setup",
            "cache[1].id",
            "cache[1].preset"
        ],
        "{errors:?}"
    );
    // A literal mountpoint below a legitimate directory and templated ones pass.
    for mp in [
        "/opt/tools/x",
        "{workdir}/.venv",
        "{mount_root}/x",
        "/srv/{env:X}/y",
    ] {
        let text = format!(
            "project = \"p\"\n[[cache]]\nid = \"a\"\npreset = \"npm\"\nmountpoint = \"{mp}\"\n"
        );
        assert!(parse(&text).is_ok(), "{mp}");
    }
}

#[test]
fn resolve_existing_follows_the_symlinks_of_the_existing_part() {
    let t = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(t.path()).unwrap();
    std::os::unix::fs::symlink("/etc", base.join("lnk")).unwrap();
    std::fs::create_dir(base.join("real")).unwrap();
    assert_eq!(
        resolve_existing(&base.join("lnk/a/b")).unwrap(),
        Path::new("/etc/a/b")
    );
    assert_eq!(
        resolve_existing(&base.join("real/new")).unwrap(),
        base.join("real/new")
    );
    assert!(check_root("--mount-root", &base.join("lnk")).is_err());
    assert!(check_root("--mount-root", &base.join("real")).is_ok());
    // A dangling symlink cannot be resolved: an error, not a path taken as not existing.
    std::os::unix::fs::symlink(base.join("gone"), base.join("dangling")).unwrap();
    assert!(resolve_existing(&base.join("dangling/x")).is_err());
}

/// A duplicate id is named even when the earlier cache of that id is bad itself, and two
/// caches with one mountpoint (as written, or by default `{mount_root}/<id>`) are refused when
/// the spec is read, as `layercache run` refuses them, so the API's validation agrees.
#[test]
fn duplicate_ids_and_shared_mountpoints_are_listed() {
    let errors = parse_all(
        "project = \"p\"\n[[cache]]\nid = \"a\"\npreset = \"npm\"\nmountpoint = \"/etc\"\n\
         [[cache]]\nid = \"a\"\npreset = \"npm\"\n",
    )
    .unwrap_err();
    assert!(
        errors.iter().any(|e| e.starts_with("cache[0].mountpoint")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("cache[1].id") && e.contains("also cache[0].id")),
        "{errors:?}"
    );
    let errors = parse_all(
        "project = \"p\"\n[[cache]]\nid = \"a\"\npreset = \"npm\"\nmountpoint = \"{mount_root}/x\"\n\
         [[cache]]\nid = \"b\"\npreset = \"npm\"\nmountpoint = \"{mount_root}/x/\"\n\
         [[cache]]\nid = \"x\"\npreset = \"npm\"\n",
    )
    .unwrap_err();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(errors[0].starts_with("cache[1].mountpoint") && errors[0].contains("cache \"a\""));
    assert!(errors[1].starts_with("cache[2].mountpoint"), "{errors:?}");
    assert!(
        parse_all(
            "project = \"p\"\n[[cache]]\nid = \"a\"\npreset = \"npm\"\n[[cache]]\nid = \"b\"\n\
             preset = \"npm\"\n"
        )
        .is_ok()
    );
}

#[test]
fn save_is_per_cache_and_miss_by_default() {
    use super::SaveWhen;
    let s = parse(
        "project = \"p\"\n[[cache]]\nid = \"a\"\npreset = \"npm\"\n\
         [[cache]]\nid = \"b\"\npreset = \"cargo-target\"\nsave = \"success\"\n",
    )
    .unwrap();
    assert_eq!(s.caches[0].save, SaveWhen::Miss);
    assert_eq!(s.caches[1].save, SaveWhen::Success);
    let e = err("project = \"p\"\n[[cache]]\nid = \"a\"\npreset = \"npm\"\nsave = \"always\"\n");
    assert!(
        e.contains("cache[0].save: \"always\": want \"miss\"") && e.contains("\"success\""),
        "{e}"
    );
}

#[test]
fn an_unclosed_template_is_refused_and_shell_braces_pass() {
    let e = err(
        "project = \"p\"\n[[cache]]\nid = \"a\"\nkey_files = [\"x\"]\nsetup = \"cp -r x {mount_root/a\"\n",
    );
    assert!(
        e.contains("cache[0].setup: unclosed template {mount_root (write {mount_root}"),
        "{e}"
    );
    let e = err(
        "project = \"p\"\n[[cache]]\nid = \"a\"\nkey_files = [\"x\"]\nsetup = \"true\"\nenv = { A = \"{env:HOME\" }\n",
    );
    assert!(e.contains("unclosed template {env:HOME"), "{e}");
    parse(
        "project = \"p\"\n[[cache]]\nid = \"a\"\nkey_files = [\"x\"]\n\
         setup = \"{ echo; } && echo ${HOME} {{mount\"\n",
    )
    .unwrap();
}

#[test]
fn unset_variables_are_named() {
    let s = parse(
        "project = \"p\"\n[[cache]]\nid = \"a\"\nkey_files = [\"x\"]\n\
         setup = \"x {env:LAYERCACHE_SURELY_UNSET_A} {env:PATH}\"\n\
         maintenance = \"{env:LAYERCACHE_SURELY_UNSET_B}\"\n",
    )
    .unwrap();
    assert_eq!(
        s.caches[0].unset_variables(),
        vec!["LAYERCACHE_SURELY_UNSET_A", "LAYERCACHE_SURELY_UNSET_B"]
    );
}

#[test]
fn uv_presets_copy_instead_of_hardlinking_across_mounts() {
    let s = parse(
        "project = \"p\"\n[[cache]]\nid = \"venv\"\npreset = \"venv\"\n\
         [[cache]]\nid = \"uv\"\npreset = \"uv\"\n",
    )
    .unwrap();
    for c in &s.caches {
        assert_eq!(c.env.get("UV_LINK_MODE").map(String::as_str), Some("copy"));
    }
}

#[test]
fn unless_mounted_scripts_are_read_back() {
    let npm = preset("npm").unwrap().maintenance.unwrap();
    assert_eq!(unless_mounted_dir(npm), Some("node_modules"));
    for p in ["pnpm", "yarn"] {
        let m = preset(p).unwrap().maintenance.unwrap();
        assert_eq!(unless_mounted_dir(m), Some("node_modules"), "{p}");
    }
    let m = |s| unless_mounted_dir(s);
    assert_eq!(
        m("mountpoint -q .venv 2>/dev/null || uv sync"),
        Some(".venv")
    );
    // More after the test's answer, another shape, or not one plain name: None.
    assert_eq!(m("mountpoint -q node_modules 2>/dev/null || a; b"), None);
    assert_eq!(m("mountpoint -q node_modules 2>/dev/null || a && b"), None);
    assert_eq!(m("mountpoint -q node_modules 2>/dev/null || a\nb"), None);
    assert_eq!(m("mountpoint -q node_modules 2>/dev/null || "), None);
    assert_eq!(m("mountpoint -q a/b 2>/dev/null || x"), None);
    assert_eq!(m("mountpoint -q .. 2>/dev/null || x"), None);
    assert_eq!(m("mountpoint -q {mount} 2>/dev/null || x"), None);
    assert_eq!(m("mountpoint node_modules 2>/dev/null || x"), None);
    assert_eq!(m("npm ci"), None);
}
