use super::env::*;
use super::includes::*;
use super::*;
use crate::spec;

fn setup_dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    fs::write(d.path().join("package-lock.json"), b"{\"v\":1}").unwrap();
    fs::write(d.path().join("package.json"), b"{}").unwrap();
    d
}

/// Paths of a workdir `dir` with caches mounted under `mount_root`.
fn paths(dir: &Path, mount_root: &str) -> Paths {
    Paths {
        workdir: dir.to_path_buf(),
        mount_root: mount_root.into(),
        workdir_view: None,
    }
}

fn keys(spec_text: &str, dir: &Path, image: Option<&str>) -> Result<CacheKeys> {
    let s = spec::parse(spec_text)?;
    let paths = paths(dir, "/cache");
    let env = Environment::with_versions(image.map(String::from), &[("node", "v20.0.0")]);
    compute(&s.caches[0], &paths, &env)
}

const NPM: &str = "project = \"p\"\n[[cache]]\nid = \"npm\"\npreset = \"npm\"\n";

#[test]
fn key_is_stable_and_well_formed() {
    let d = setup_dir();
    let a = keys(NPM, d.path(), None).unwrap();
    let b = keys(NPM, d.path(), None).unwrap();
    assert_eq!(a.key, b.key);
    let k = a.key.as_str();
    let prefix = format!("npm-{}-{}-", std::env::consts::OS, std::env::consts::ARCH);
    assert!(k.starts_with(&prefix), "{k}");
    assert_eq!(k.len(), prefix.len() + 8 + 1 + HASH_HEX, "{k}");
    assert_eq!(a.restore_keys.len(), 1);
    assert_eq!(a.restore_keys[0].as_str(), a.prefix());
    assert!(a.prefix().ends_with('-'));
    assert_eq!(a.key_files, [PathBuf::from("package-lock.json")]);
    assert_eq!(a.mountpoint, Path::new("/cache/npm"));
}

#[test]
fn lockfile_change_changes_key_not_prefix() {
    let d = setup_dir();
    let a = keys(NPM, d.path(), None).unwrap();
    fs::write(d.path().join("package-lock.json"), b"{\"v\":2}").unwrap();
    let b = keys(NPM, d.path(), None).unwrap();
    assert_ne!(a.key, b.key);
    assert_eq!(a.prefix(), b.prefix());
    // a second key file also changes it
    fs::write(d.path().join("npm-shrinkwrap.json"), b"{}").unwrap();
    let c = keys(NPM, d.path(), None).unwrap();
    assert_ne!(b.key, c.key);
    // files not named as key files do not
    fs::write(d.path().join("README"), b"x").unwrap();
    assert_eq!(keys(NPM, d.path(), None).unwrap().key, c.key);
}

#[test]
fn setup_change_changes_key_not_prefix() {
    let d = setup_dir();
    let a = keys(NPM, d.path(), None).unwrap();
    let b = keys(&format!("{NPM}setup = \"npm install\"\n"), d.path(), None).unwrap();
    assert_ne!(a.key, b.key);
    assert_eq!(a.prefix(), b.prefix());
    // maintenance does not change what the layer holds
    let c = keys(&format!("{NPM}maintenance = \"true\"\n"), d.path(), None).unwrap();
    assert_eq!(a.key, c.key);
}

#[test]
fn in_an_image_the_image_id_stands_for_the_tools() {
    let a = Environment::in_image("sha256:aa".into()).fingerprint(&["node"]);
    assert!(a.contains("image=sha256:aa\nnode=in image\n"), "{a}");
    let b = Environment::in_image("sha256:bb".into()).fingerprint(&["node"]);
    assert_ne!(a, b);
    // No host probe: a tool the host lacks is still `in image`.
    let c = Environment::in_image("sha256:aa".into()).fingerprint(&["no-such-tool-xyz"]);
    assert!(c.ends_with("no-such-tool-xyz=in image\n"), "{c}");
}

#[test]
fn image_tool_or_mountpoint_change_changes_prefix() {
    let d = setup_dir();
    let a = keys(NPM, d.path(), Some("img-a")).unwrap();
    let b = keys(NPM, d.path(), Some("img-b")).unwrap();
    assert_ne!(a.prefix(), b.prefix());
    assert_ne!(a.key, b.key);
    let s = spec::parse(NPM).unwrap();
    let env = Environment::with_versions(Some("img-a".into()), &[("node", "v22.0.0")]);
    let c = compute(&s.caches[0], &paths(d.path(), "/cache"), &env).unwrap();
    assert_ne!(a.prefix(), c.prefix());
    // npm's cache is relocatable: another mount root or workdir is the same key.
    let env = Environment::with_versions(Some("img-a".into()), &[("node", "v20.0.0")]);
    let m = compute(&s.caches[0], &paths(d.path(), "/elsewhere"), &env).unwrap();
    assert_eq!(a.key, m.key);
    let other = tempfile::tempdir().unwrap();
    fs::copy(
        d.path().join("package-lock.json"),
        other.path().join("package-lock.json"),
    )
    .unwrap();
    let w = compute(&s.caches[0], &paths(other.path(), "/cache"), &env).unwrap();
    assert_eq!(a.key, w.key, "a new workspace path hits");
    // A venv is path-bound: another view path is another environment (no restore across
    // view paths either), the same view path (`--workdir-view`) the same key.
    let venv = spec::parse("project = \"p\"\n[[cache]]\nid = \"v\"\npreset = \"venv\"\nkey_files = [\"package-lock.json\"]\n").unwrap();
    let v1 = compute(&venv.caches[0], &paths(d.path(), "/cache"), &env).unwrap();
    let v2 = compute(&venv.caches[0], &paths(other.path(), "/cache"), &env).unwrap();
    assert_ne!(v1.prefix(), v2.prefix());
    let view = |dir: &Path| Paths {
        workdir_view: Some("/workspace".into()),
        ..paths(dir, "/cache")
    };
    let v3 = compute(&venv.caches[0], &view(d.path()), &env).unwrap();
    let v4 = compute(&venv.caches[0], &view(other.path()), &env).unwrap();
    assert_eq!(v3.key, v4.key);
    assert_eq!(v3.mountpoint, Path::new("/workspace/.venv"));
    // The miss reason lists only inputs of the key: a relocatable cache's
    // mountpoint is none, a path-bound one's is.
    assert!(!a.inputs.contains_key("mountpoint"), "{:?}", a.inputs);
    assert!(crate::why::diff(&a.inputs, &w.inputs).is_empty());
    assert_eq!(
        v1.inputs.get("mountpoint").map(String::as_str),
        Some(d.path().join(".venv").to_str().unwrap())
    );
    assert_eq!(crate::why::diff(&v1.inputs, &v2.inputs).len(), 1);
    // A record written before (with the relocatable cache's mountpoint) reads the same.
    let mut old = a.inputs.clone();
    old.insert("mountpoint".into(), "/a/node_modules".into());
    assert!(crate::why::diff(&old, &w.inputs).is_empty());
}

#[test]
fn explicit_restore_keys_and_missing_files() {
    let d = setup_dir();
    let k = keys(
        &format!("{NPM}restore_keys = [\"npm-linux-\", \"npm-\"]\n"),
        d.path(),
        None,
    )
    .unwrap();
    assert_eq!(k.restore_keys.len(), 2);
    let e = keys(
        &format!("{NPM}key_files = [\"nope.lock\"]\n"),
        d.path(),
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("key_files") && e.contains("nope.lock"), "{e}");
    let empty = tempfile::tempdir().unwrap();
    let e = keys(NPM, empty.path(), None).unwrap_err().to_string();
    assert!(
        e.contains("key_files") && e.contains("package-lock.json"),
        "{e}"
    );
}

/// A spec of one cache `k` whose key_files are `files` (a TOML array body).
fn with_key_files(files: &str) -> String {
    format!("project = \"p\"\n[[cache]]\nid = \"k\"\npreset = \"npm\"\nkey_files = [{files}]\n")
}

#[test]
fn key_files_symlinked_outside_the_project_are_refused() {
    use std::os::unix::fs::symlink;
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("shadow");
    fs::write(&secret, b"root:secret").unwrap();
    let real_secret = fs::canonicalize(&secret).unwrap();
    let d = tempfile::tempdir().unwrap();
    symlink(&secret, d.path().join("lock")).unwrap();
    let e = keys(&with_key_files("\"lock\""), d.path(), None).unwrap_err();
    assert!(matches!(e, Error::Invalid(_)), "{e:?}");
    let e = e.to_string();
    let want = format!("key_files \"lock\": lock -> {}", real_secret.display());
    assert!(
        e.contains(&want) && e.contains("outside the project"),
        "{e}"
    );
    assert!(!e.contains('\n'), "{e}");

    // A glob under a symlinked directory, and a glob whose walk enters one.
    symlink(outside.path(), d.path().join("sub")).unwrap();
    let e = keys(&with_key_files("\"sub/*\""), d.path(), None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("key_files \"sub/*\": sub -> "), "{e}");
    fs::remove_file(d.path().join("sub")).unwrap();
    fs::create_dir(d.path().join("real")).unwrap();
    fs::write(d.path().join("real/x.lock"), b"in").unwrap();
    symlink(outside.path(), d.path().join("other")).unwrap();
    fs::write(outside.path().join("x.lock"), b"out").unwrap();
    let e = keys(&with_key_files("\"*/x.lock\""), d.path(), None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("other/x.lock -> ") && e.contains("outside"),
        "{e}"
    );
}

#[test]
fn key_file_symlinks_inside_the_project_are_followed() {
    use std::os::unix::fs::symlink;
    let d = tempfile::tempdir().unwrap();
    fs::create_dir(d.path().join("real")).unwrap();
    fs::write(d.path().join("real/a.lock"), b"1").unwrap();
    symlink("real/a.lock", d.path().join("lock")).unwrap();
    symlink("real", d.path().join("sub")).unwrap();
    let k = keys(&with_key_files("\"lock\", \"sub/*\""), d.path(), None).unwrap();
    assert_eq!(
        k.key_files,
        [PathBuf::from("lock"), PathBuf::from("sub/a.lock")]
    );
    fs::write(d.path().join("real/a.lock"), b"2").unwrap();
    let k2 = keys(&with_key_files("\"lock\", \"sub/*\""), d.path(), None).unwrap();
    assert_ne!(k.key, k2.key);
}

#[test]
fn a_directory_as_key_file_says_so() {
    let d = tempfile::tempdir().unwrap();
    fs::create_dir(d.path().join("deps")).unwrap();
    let e = keys(&with_key_files("\"deps\""), d.path(), None).unwrap_err();
    assert!(matches!(e, Error::Invalid(_)), "{e:?}");
    let e = e.to_string();
    assert!(
        e.contains("\"deps\" is a directory") && e.contains("\"deps/*\""),
        "{e}"
    );
}

#[test]
fn recursive_patterns_skip_installed_trees() {
    let d = tempfile::tempdir().unwrap();
    fs::create_dir_all(d.path().join("sub/node_modules/x")).unwrap();
    fs::write(d.path().join("go.sum"), b"a").unwrap();
    fs::write(d.path().join("sub/go.sum"), b"b").unwrap();
    fs::write(d.path().join("sub/node_modules/x/go.sum"), b"c").unwrap();
    let k = keys(
        "project = \"p\"\n[[cache]]\nid = \"go\"\npreset = \"go\"\n",
        d.path(),
        None,
    )
    .unwrap();
    assert_eq!(
        k.key_files,
        [PathBuf::from("go.sum"), PathBuf::from("sub/go.sum")]
    );
}

#[test]
fn globs() {
    let m = |p: &str, path: &str| Pattern::new(p).unwrap().is_match(Path::new(path));
    assert!(m("requirements*.txt", "requirements-dev.txt"));
    assert!(!m("requirements*.txt", "sub/requirements.txt"));
    assert!(m("**/go.sum", "go.sum"));
    assert!(m("**/go.sum", "a/b/go.sum"));
    assert!(m("**/*.gradle*", "app/build.gradle.kts"));
    assert!(!m("Cargo.lock", "Cargo.toml"));
    assert!(m("a?c", "abc"));
    // A literal pattern is compared as text, not compiled: exactly its path, nothing below,
    // above or beside it; empty components dropped as for a glob.
    assert!(Pattern::new("sub/Cargo.lock").unwrap().is_literal());
    assert!(m("sub//Cargo.lock/", "sub/Cargo.lock"));
    assert!(!m("sub/Cargo.lock", "Cargo.lock"));
    assert!(!m("sub", "sub/Cargo.lock"));
    assert!(!m("Cargo.lock", "Cargo.lock.bak"));
    // Any of globset's syntax makes it a glob: `\` escapes, a lone `]` is compiled too.
    assert!(!Pattern::new("a\\*b").unwrap().is_literal());
    assert!(m("a\\*b", "a*b"));
    assert!(!m("a\\*b", "axb"));
    assert!(!Pattern::new("x]").unwrap().is_literal());
    let e = Pattern::new("a[").unwrap_err();
    assert!(e.contains("a["), "{e}");
}

const VENV: &str = "project = \"p\"\n[[cache]]\nid = \"venv\"\npreset = \"venv\"\n";
const PIP: &str = "project = \"p\"\n[[cache]]\nid = \"pip\"\npreset = \"pip\"\n";

#[test]
fn requirements_includes_join_the_key() {
    let d = tempfile::tempdir().unwrap();
    let w = d.path();
    fs::create_dir(w.join("sub")).unwrap();
    fs::write(
        w.join("requirements.txt"),
        "# deps\n-r base.txt\nrequests==2.0  # -r not-this.txt\n--constraint=sub/c.txt\n",
    )
    .unwrap();
    fs::write(w.join("sub/c.txt"), "-r ../common.txt\n").unwrap();
    for spec in [VENV, PIP] {
        fs::write(w.join("base.txt"), "six==1.0\n-r requirements.txt\n").unwrap();
        fs::write(w.join("common.txt"), "idna==1.0\n").unwrap();
        let a = keys(spec, w, None).unwrap();
        let want: Vec<PathBuf> = ["base.txt", "common.txt", "requirements.txt", "sub/c.txt"]
            .iter()
            .map(PathBuf::from)
            .collect();
        assert_eq!(a.key_files, want, "{spec}");
        assert!(
            a.inputs.contains_key("key file common.txt"),
            "{:?}",
            a.inputs
        );
        // An edit of an included file (two levels down) is another key.
        fs::write(w.join("common.txt"), "idna==2.0\n").unwrap();
        let b = keys(spec, w, None).unwrap();
        assert_ne!(a.key, b.key, "{spec}");
        fs::write(w.join("base.txt"), "six==2.0\n-r requirements.txt\n").unwrap();
        assert_ne!(keys(spec, w, None).unwrap().key, b.key, "{spec}");
    }
}

#[test]
fn requirements_includes_outside_the_project_are_refused() {
    use std::os::unix::fs::symlink;
    let d = tempfile::tempdir().unwrap();
    let w = d.path().join("proj");
    fs::create_dir(&w).unwrap();
    fs::write(d.path().join("secret.txt"), "x\n").unwrap();
    fs::write(w.join("requirements.txt"), "six\n\n-r ../secret.txt\n").unwrap();
    let e = keys(VENV, &w, None).unwrap_err();
    assert!(matches!(e, Error::Invalid(_)), "{e:?}");
    let e = e.to_string();
    assert!(
        e.contains("key file requirements.txt line 3: -r ../secret.txt")
            && e.contains("outside the project"),
        "{e}"
    );
    assert!(!e.contains('\n'), "{e}");
    // Through a symlink inside the project, and as an absolute path.
    symlink(d.path().join("secret.txt"), w.join("link.txt")).unwrap();
    fs::write(w.join("requirements.txt"), "-c link.txt\n").unwrap();
    let e = keys(VENV, &w, None).unwrap_err().to_string();
    assert!(e.contains("-c link.txt") && e.contains("outside"), "{e}");
    let abs = d.path().join("secret.txt");
    fs::write(w.join("requirements.txt"), format!("-r{}\n", abs.display())).unwrap();
    let e = keys(VENV, &w, None).unwrap_err().to_string();
    assert!(e.contains("outside the project"), "{e}");
    // A missing include names itself and where it was looked for.
    fs::write(w.join("requirements.txt"), "-r nope.txt\n").unwrap();
    let e = keys(VENV, &w, None).unwrap_err().to_string();
    assert!(
        e.contains("line 1: -r nope.txt: cannot read") && e.contains("nope.txt"),
        "{e}"
    );
}

/// `${NAME}` in an include's path is expanded from the run's environment as pip does; an
/// unset one skips the include (a warning), never a "missing file" error.
#[test]
fn requirements_includes_expand_environment_references() {
    let d = tempfile::tempdir().unwrap();
    let w = d.path();
    fs::create_dir(w.join("reqs")).unwrap();
    fs::write(w.join("reqs/prod.txt"), "six\n").unwrap();
    fs::write(
        w.join("requirements.txt"),
        "-r reqs/${STAGE}.txt\n-c ${MISSING_VAR}/c.txt\n-r ${lower}.txt\n",
    )
    .unwrap();
    fs::write(w.join("${lower}.txt"), "").unwrap();
    let root = fs::canonicalize(w).unwrap();
    let env = |n: &str| (n == "STAGE").then(|| "prod".to_string());
    let mut found = vec![PathBuf::from("requirements.txt")];
    follow_includes("venv", w, &root, &env, &mut found).unwrap();
    found.sort();
    let want = ["${lower}.txt", "reqs/prod.txt", "requirements.txt"];
    assert_eq!(found, want.map(PathBuf::from));
    // Unset, the include is skipped rather than refused.
    let mut found = vec![PathBuf::from("requirements.txt")];
    follow_includes("venv", w, &root, &|_| None, &mut found).unwrap();
    assert_eq!(found.len(), 2, "{found:?}");
    // Through compute: the cache's env names the file; unset, the include is skipped.
    let with_env = format!("{VENV}env = {{ STAGE = \"prod\" }}\n");
    fs::write(w.join("requirements.txt"), "-r reqs/${STAGE}.txt\n").unwrap();
    let k = keys(&with_env, w, None).unwrap();
    assert!(
        k.key_files.contains(&PathBuf::from("reqs/prod.txt")),
        "{:?}",
        k.key_files
    );
    if std::env::var_os("STAGE").is_none() {
        let k = keys(VENV, w, None).unwrap();
        assert_eq!(k.key_files, [PathBuf::from("requirements.txt")]);
    }
    assert_eq!(
        expand_env_vars("a${B}c${", &|_| Some("x".into())).unwrap(),
        "axc${"
    );
    assert_eq!(
        expand_env_vars("${X}${Y}", &|n| (n == "X").then(String::new)),
        Err("Y".into())
    );
}

#[test]
fn requirements_includes_are_bounded() {
    let d = tempfile::tempdir().unwrap();
    let w = d.path();
    fs::write(w.join("requirements.txt"), "-r r0.txt\n").unwrap();
    for n in 0..20 {
        fs::write(w.join(format!("r{n}.txt")), format!("-r r{}.txt\n", n + 1)).unwrap();
    }
    let e = keys(VENV, w, None).unwrap_err().to_string();
    assert!(e.contains("nest deeper than 8"), "{e}");
}

#[test]
fn venv_keys_on_the_installer_its_setup_runs() {
    let d = tempfile::tempdir().unwrap();
    let w = d.path();
    fs::write(w.join("requirements.txt"), "six\n").unwrap();
    fs::write(w.join("requirements-dev.txt"), "pytest\n").unwrap();
    let pip = keys(VENV, w, None).unwrap();
    assert_eq!(pip.key_files, [PathBuf::from("requirements.txt")]);
    fs::write(w.join("poetry.lock"), "p\n").unwrap();
    let poetry = keys(VENV, w, None).unwrap();
    assert_eq!(poetry.key_files, [PathBuf::from("poetry.lock")]);
    fs::write(w.join("uv.lock"), "u\n").unwrap();
    let uv = keys(VENV, w, None).unwrap();
    assert_eq!(uv.key_files, [PathBuf::from("uv.lock")]);
    // uv sync reads uv.lock, not requirements.txt: editing that is the same key.
    fs::write(w.join("requirements.txt"), "six==9\n").unwrap();
    assert_eq!(keys(VENV, w, None).unwrap().key, uv.key);
    // A spec's own key_files are all read.
    let own = format!("{VENV}key_files = [\"uv.lock\", \"requirements.txt\"]\n");
    let k = keys(&own, w, None).unwrap();
    assert_eq!(
        k.key_files,
        [PathBuf::from("requirements.txt"), PathBuf::from("uv.lock")]
    );
}

#[test]
fn requirement_include_lines() {
    let text = "a\n-r x.txt\n--requirement=y.txt\n--requirement  z.txt\n-cw.txt\n\
                --constraint \"q.txt\"\n--require-hashes\n# -r no.txt\nb # -r no.txt\n\
                -r \\\n  cont.txt\n-r\n";
    let got = requirement_includes(text);
    let want = [
        (2, "-r", "x.txt"),
        (3, "--requirement", "y.txt"),
        (4, "--requirement", "z.txt"),
        (5, "-c", "w.txt"),
        (6, "--constraint", "q.txt"),
        (10, "-r", "cont.txt"),
    ];
    let got: Vec<(usize, &str, &str)> = got.iter().map(|(n, o, f)| (*n, *o, f.as_str())).collect();
    assert_eq!(got, want);
}

#[test]
fn env_templates_of_setup_and_env_are_key_inputs() {
    let d = setup_dir();
    let spec = format!(
        "{NPM}setup = \"npm ci --registry {{env:LC_REGISTRY}}\"\n\
         env = {{ NPM_PIN = \"{{env:LC_PIN}}\", NPM_PATH = \"{{env:PATH}}\" }}\n\
         maintenance = \"echo {{env:LC_MAINT}}\"\n"
    );
    let s = spec::parse(&spec).unwrap();
    assert_eq!(s.caches[0].key_variables(), ["LC_PIN", "LC_REGISTRY"]);
    let k = |vars: &[(&str, &str)]| {
        let env = Environment::with_versions(None, &[("node", "v20.0.0")]).with_variables(vars);
        compute(&s.caches[0], &paths(d.path(), "/cache"), &env).unwrap()
    };
    let base = [
        ("LC_REGISTRY", "https://a"),
        ("LC_PIN", "1"),
        ("PATH", "/bin"),
    ];
    let a = k(&base);
    let b = k(&[
        ("LC_REGISTRY", "https://b"),
        ("LC_PIN", "1"),
        ("PATH", "/bin"),
    ]);
    assert_ne!(a.key, b.key, "the registry shapes what setup installs");
    assert_eq!(a.prefix(), b.prefix(), "a restore across it is fine");
    assert_ne!(k(&base[..1]).key, a.key, "LC_PIN unset is another key");
    assert_ne!(
        k(&[("LC_PIN", "1"), ("LC_REGISTRY", "")]).key,
        k(&base[1..2]).key
    );
    // PATH and maintenance's variables are not inputs.
    let c = k(&[
        ("LC_REGISTRY", "https://a"),
        ("LC_PIN", "1"),
        ("PATH", "/usr/bin"),
    ]);
    assert_eq!(a.key, c.key);
    let e = k(&[
        ("LC_REGISTRY", "https://a"),
        ("LC_PIN", "1"),
        ("PATH", "/bin"),
        ("LC_MAINT", "x"),
    ]);
    assert_eq!(a.key, e.key);
    // The inputs name the variable and hold a digest, never the value; a miss says which.
    let shown = &a.inputs["variable LC_REGISTRY"];
    assert_eq!(shown.len(), 16);
    assert!(!shown.contains("https"));
    assert_eq!(k(&base[..1]).inputs["variable LC_PIN"], "unset");
    assert_eq!(
        crate::why::diff(&a.inputs, &b.inputs),
        ["variable LC_REGISTRY changed"]
    );
}

const NODE_MODULES: &str =
    "project = \"p\"\n[[cache]]\nid = \"node_modules\"\npreset = \"node_modules\"\n";

/// What npm ci reads besides the lockfile. Two workspaces with one
/// lockfile: a `postinstall` (root or workspace package), an `.npmrc` is another key and
/// another restore prefix (a tree made under other scripts is never restored from); a
/// dependency field another key but the same prefix; a description, version or test
/// script the same key. `.npmrc` enters as a digest only.
#[test]
fn node_keys_cover_lifecycle_scripts_and_npmrc() {
    let a = setup_dir();
    let b = setup_dir();
    let pkg = |d: &Path, text: &str| fs::write(d.join("package.json"), text).unwrap();
    let base = r#"{"name":"app","version":"1.0.0","scripts":{"test":"jest"},
        "dependencies":{"lodash":"4.17.21"}}"#;
    pkg(a.path(), base);
    pkg(b.path(), base);
    let k = |d: &Path| keys(NODE_MODULES, d, None).unwrap();
    assert_eq!(k(a.path()).key, k(b.path()).key);
    pkg(
        a.path(),
        r#"{"name":"app","version":"1.0.0","scripts":{"test":"jest",
        "postinstall":"echo evil > node_modules/lodash/lodash.js"},
        "dependencies":{"lodash":"4.17.21"}}"#,
    );
    let (ka, kb) = (k(a.path()), k(b.path()));
    assert_ne!(ka.key, kb.key, "a postinstall is another key");
    assert_ne!(ka.prefix(), kb.prefix(), "…and no restore across it");
    assert_eq!(
        crate::why::diff(&kb.inputs, &ka.inputs),
        ["config package.json changed"]
    );
    // Descriptive fields and other scripts are not inputs.
    pkg(
        b.path(),
        r#"{"name":"app","version":"2.0.0","description":"d","scripts":{"test":"mocha"},
        "dependencies":{"lodash":"4.17.21"}}"#,
    );
    assert_eq!(k(b.path()).key, kb.key);
    // A dependency field: another key, the same prefix (a restore is fine).
    pkg(
        b.path(),
        r#"{"name":"app","dependencies":{"lodash":"4.17.20"}}"#,
    );
    let dep = k(b.path());
    assert_ne!(dep.key, kb.key);
    assert_eq!(dep.prefix(), kb.prefix());
    pkg(b.path(), base);
    // A workspace package's postinstall.
    fs::create_dir_all(b.path().join("packages/w")).unwrap();
    pkg(
        b.path(),
        r#"{"name":"app","workspaces":["packages/*"],"dependencies":{"lodash":"4.17.21"}}"#,
    );
    let ws0 = k(b.path());
    fs::write(
        b.path().join("packages/w/package.json"),
        r#"{"name":"w","scripts":{"postinstall":"touch x"}}"#,
    )
    .unwrap();
    let ws1 = k(b.path());
    assert_ne!(ws0.prefix(), ws1.prefix());
    assert!(ws1.inputs.contains_key("config packages/w/package.json"));
    // .npmrc: another key and prefix; the inputs hold a digest, never the token.
    fs::write(b.path().join(".npmrc"), "//r/:_authToken=npm_secret123\n").unwrap();
    let rc = k(b.path());
    assert_ne!(rc.prefix(), ws1.prefix());
    let shown = &rc.inputs["config .npmrc"];
    assert_eq!(shown.len(), 16);
    assert!(!format!("{:?}", rc.inputs).contains("npm_secret123"));
    // pnpm's hooks file and workspace file too.
    fs::write(b.path().join(".pnpmfile.cjs"), "module.exports = {}\n").unwrap();
    assert_ne!(k(b.path()).prefix(), rc.prefix());
}

/// cargo-target: a member's Cargo.toml is another key (a restore is fine), the project's
/// `.cargo/config.toml` and `rust-toolchain.toml` another prefix; a venv's pyproject
/// build settings another prefix.
#[test]
fn cargo_target_and_venv_keys_cover_their_tool_config() {
    let d = tempfile::tempdir().unwrap();
    let w = d.path();
    fs::write(w.join("Cargo.lock"), "# lock\n").unwrap();
    fs::create_dir_all(w.join("crates/a")).unwrap();
    fs::write(w.join("crates/a/Cargo.toml"), "[package]\nname = \"a\"\n").unwrap();
    let spec = "project = \"p\"\n[[cache]]\nid = \"t\"\npreset = \"cargo-target\"\n";
    let k0 = keys(spec, w, None).unwrap();
    assert!(k0.inputs.contains_key("config crates/a/Cargo.toml"));
    fs::write(
        w.join("crates/a/Cargo.toml"),
        "[package]\nname = \"a\"\n[features]\nx = []\n",
    )
    .unwrap();
    let k1 = keys(spec, w, None).unwrap();
    assert_ne!(k1.key, k0.key);
    assert_eq!(k1.prefix(), k0.prefix());
    fs::create_dir(w.join(".cargo")).unwrap();
    fs::write(
        w.join(".cargo/config.toml"),
        "[build]\nrustflags = [\"-Cx\"]\n",
    )
    .unwrap();
    assert_ne!(keys(spec, w, None).unwrap().prefix(), k1.prefix());

    fs::write(w.join("requirements.txt"), "six\n").unwrap();
    let v0 = keys(VENV, w, None).unwrap();
    fs::write(
        w.join("pyproject.toml"),
        "[tool.uv]\nindex-url = \"https://x\"\n",
    )
    .unwrap();
    let v1 = keys(VENV, w, None).unwrap();
    assert_ne!(v1.prefix(), v0.prefix());
    fs::write(
        w.join("pyproject.toml"),
        "[tool.uv]\nindex-url = \"https://x\"\n[tool.ruff]\nline-length = 1\n",
    )
    .unwrap();
    assert_eq!(keys(VENV, w, None).unwrap().key, v1.key);
    // A uv workspace member's pyproject.toml joins (its build settings: another prefix).
    fs::write(
        w.join("pyproject.toml"),
        "[tool.uv]\nindex-url = \"https://x\"\n[tool.uv.workspace]\nmembers = [\"libs/*\"]\n",
    )
    .unwrap();
    fs::create_dir_all(w.join("libs/m")).unwrap();
    fs::write(w.join("libs/m/pyproject.toml"), "[project]\nname = \"m\"\n").unwrap();
    let m0 = keys(VENV, w, None).unwrap();
    assert!(
        m0.inputs.contains_key("config libs/m/pyproject.toml"),
        "{:?}",
        m0.inputs
    );
    fs::write(
        w.join("libs/m/pyproject.toml"),
        "[project]\nname = \"m\"\n[build-system]\nrequires = [\"evil\"]\n",
    )
    .unwrap();
    assert_ne!(keys(VENV, w, None).unwrap().prefix(), m0.prefix());
}

/// A variable's recorded digest is keyed with the project's salt —
/// not plain blake3's prefix (which an offline guesser could match), another per project,
/// the same for one project's runs; the key itself is keyed too.
#[test]
fn digests_are_keyed_with_the_project_salt() {
    let d = setup_dir();
    let s = spec::parse(&format!("{NPM}env = {{ TOKEN = \"{{env:MY_TOKEN}}\" }}\n")).unwrap();
    let k = |salt: Option<[u8; 32]>| {
        let mut env = Environment::with_versions(None, &[("node", "v20.0.0")])
            .with_variables(&[("MY_TOKEN", "hunter2")]);
        if let Some(s) = salt {
            env = env.with_salt(KeySalt(s));
        }
        compute(&s.caches[0], &paths(d.path(), "/cache"), &env).unwrap()
    };
    let plain = blake3::hash(b"hunter2").to_hex()[..16].to_string();
    assert_eq!(plain, "55dcd1221c6686fb");
    let (p1, p2) = ([1u8; 32], [2u8; 32]);
    let a = k(Some(p1));
    let shown = &a.inputs["variable MY_TOKEN"];
    assert_eq!(shown.len(), 16);
    assert_ne!(shown, &plain);
    assert!(!serde_json::to_string(&a).unwrap().contains(&plain));
    let b = k(Some(p2));
    assert_ne!(
        b.inputs["variable MY_TOKEN"], *shown,
        "another project's digest"
    );
    assert_ne!(b.key, a.key);
    assert_ne!(b.prefix(), a.prefix(), "env8 is keyed too");
    let again = k(Some(p1));
    assert_eq!((again.key, &again.inputs), (a.key.clone(), &a.inputs));
    assert_eq!(
        k(None).inputs["variable MY_TOKEN"],
        plain,
        "unsalted: plain blake3"
    );
}

#[test]
fn missing_tool_is_none() {
    assert_eq!(probe_version("layercache-no-such-tool"), "none");
}

#[test]
fn started_probe_is_what_the_key_reads() {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    let tool = d.path().join("tool");
    let count = d.path().join("count");
    std::fs::write(
        &tool,
        format!(
            "#!/bin/sh\necho x >> '{}'\necho \"tool 1.$1\"\n",
            count.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    let tool = tool.to_str().unwrap();
    let runs = || std::fs::read_to_string(&count).map_or(0, |s| s.lines().count());
    start_probes([tool, tool]);
    // The started process's output is taken: the tool ran once, whatever the timing.
    assert_eq!(probe_version(tool), "tool 1.--version");
    assert_eq!(runs(), 1, "started once, read once");
    // Taken: the next probe runs the tool again.
    assert_eq!(probe_version(tool), "tool 1.--version");
    assert_eq!(runs(), 2);
    // A tool that cannot be spawned is not kept; probing it says none.
    let missing = d.path().join("missing");
    start_probes([missing.to_str().unwrap()]);
    assert_eq!(probe_version(missing.to_str().unwrap()), "none");
}
