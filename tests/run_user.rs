//! `layercache run --user` for `--sandbox none` and `--sandbox bwrap` (issue 12), as root with
//! real mounts: a run as 1000:1000 creates, edits and removes files in a cache root filled
//! (modes still enforced: a 0444 file stays unwritable), a layer filled by uid 1000 is used
//! read-write by uid 1001 in a later run (the spec's `user`; `--user` overrides it), every
//! published layer holds the canonical owner 0:0 (also a file a root setup chowned to 1000),
//! `npm install` of a package into a root-filled node_modules works as 1000 natively, and an
//! unknown user is one line, exit 2, nothing mounted or published.
//!
//! Setup and COMMAND see the caches below the sandbox's mount root, so the sandbox directory
//! (a 0700 temp dir) is made 0755 for the other uids; the store inside stays 0700.

#[path = "common/run.rs"]
mod run_common;

use std::os::unix::fs::PermissionsExt;
use std::process::Output;

use run_common::{Sandbox, can_mount, have_tool, json_summary, layer_owners, npm_workdir, show};

/// A cache filled by its setup script: who filled it, a directory, a file, a 0444 file, and a
/// file the setup (as root) gives to uid 1000 — promote makes it 0:0.
const SPEC: &str = r#"project = "PROJECT"
[[cache]]
id = "c"
key_files = ["k"]
restore_keys = []
relocatable = true
setup = "id -u > {mount}/filled-by; mkdir -p {mount}/d/sub; echo a > {mount}/d/f; echo r > {mount}/ro; chmod 444 {mount}/ro; if [ $(id -u) = 0 ]; then echo x > {mount}/given; chown 1000:1000 {mount}/given; fi"
"#;

/// A sandbox whose directory other uids may traverse, with the spec for `project` and `user`.
fn sandbox(project: &str, user: Option<&str>) -> Sandbox {
    let sb = Sandbox::new();
    let root = sb.path("");
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut spec = SPEC.replace("PROJECT", project);
    if let Some(u) = user {
        spec = format!("user = \"{u}\"\n{spec}");
    }
    sb.write_spec("spec.toml", &spec);
    std::fs::write(sb.work().join("k"), "1").unwrap();
    sb
}

/// `run --spec spec.toml --sandbox DRIVER USER_FLAGS… -- sh -c "C=<the cache's view>; SCRIPT"`
/// in the workdir.
fn run(sb: &Sandbox, driver: &str, user: &[&str], script: &str) -> Output {
    run_spec(sb, "spec.toml", driver, user, script)
}

/// [`run`] with another spec file of the sandbox.
fn run_spec(sb: &Sandbox, spec: &str, driver: &str, user: &[&str], script: &str) -> Output {
    let c = sb.path("cache/c").display().to_string();
    let script = format!("C={c}; {script}");
    let mut flags = vec!["--sandbox", driver];
    flags.extend(user);
    sb.run_flags(&sb.path(spec), &sb.work(), &flags, &["sh", "-c", &script])
}

fn result(o: &Output) -> String {
    json_summary(o)["caches"][0]["result"]
        .as_str()
        .unwrap()
        .to_string()
}

fn assert_canonical(sb: &Sandbox) {
    let owners = layer_owners(sb);
    assert!(owners.len() >= 5, "{owners:?}");
    let odd: Vec<_> = owners.iter().filter(|o| (o.0, o.1) != (0, 0)).collect();
    assert!(odd.is_empty(), "not canonical: {odd:?}");
}

fn drivers() -> Vec<&'static str> {
    let mut d = vec!["none"];
    if have_tool("bwrap") {
        d.push("bwrap");
    }
    d
}

#[test]
fn user_1000_changes_a_root_filled_cache_and_1001_reuses_a_layer_1000_filled() {
    if !can_mount() {
        return;
    }
    for driver in drivers() {
        let sb = sandbox(&format!("user-{driver}"), None);
        // The same spec with `user = "1001:1001"`.
        let spec = std::fs::read_to_string(sb.path("spec.toml")).unwrap();
        sb.write_spec("spec-1001.toml", &format!("user = \"1001:1001\"\n{spec}"));
        // Run 1 as root: fills the cache.
        let o = run(&sb, driver, &[], "cat $C/filled-by");
        assert_eq!(o.status.code(), Some(0), "{driver}: {}", show(&o));
        assert_eq!(result(&o), "miss");
        assert!(String::from_utf8_lossy(&o.stdout).ends_with("0\n"));

        // Run 2 as 1000:1000 (a hit): creates, edits and removes anything; modes still hold.
        let script = "set -e; id -u; id -G; echo new > $C/new; echo more >> $C/d/f; \
                      rm $C/filled-by; mkdir $C/d/sub/x; rm -r $C/d/sub; echo y >> $C/given; \
                      if echo w >> $C/ro 2>/dev/null; then echo wrote-0444; fi; cat $C/d/f; ls $C";
        let o = run(&sb, driver, &["--user", "1000:1000"], script);
        assert_eq!(o.status.code(), Some(0), "{driver}: {}", show(&o));
        assert_eq!(result(&o), "hit");
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            out.contains("\n1000\n1000\na\nmore\nd\ngiven\nnew\nro\n"),
            "{driver}: {}",
            show(&o)
        );
        assert!(!out.contains("wrote-0444"), "{driver}: modes are enforced");

        // Run 3: a new key filled by uid 1000 (`--user` overrides the spec's 1001).
        std::fs::write(sb.work().join("k"), "2").unwrap();
        let o = run_spec(
            &sb,
            "spec-1001.toml",
            driver,
            &["--user", "1000:1000"],
            "cat $C/filled-by",
        );
        assert_eq!(o.status.code(), Some(0), "{driver}: {}", show(&o));
        assert_eq!(result(&o), "miss", "{driver}");
        assert!(String::from_utf8_lossy(&o.stdout).ends_with("1000\n"));

        // Run 4 as the spec's user 1001:1001 (no --user): the layer 1000 filled is its own.
        let o = run_spec(
            &sb,
            "spec-1001.toml",
            driver,
            &[],
            "set -e; id -u; echo b >> $C/d/f; rm $C/filled-by; touch $C/mine; rm -r $C/d/sub; ls $C",
        );
        assert_eq!(o.status.code(), Some(0), "{driver}: {}", show(&o));
        assert_eq!(result(&o), "hit");
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("\n1001\nd\nmine\nro\n"),
            "{driver}: {}",
            show(&o)
        );
        // Both layers (filled by 0, with a file chowned to 1000, and by 1000) are 0:0.
        assert_eq!(sb.ls().len(), 2);
        assert_canonical(&sb);
        assert!(sb.mounts_below().is_empty(), "{:?}", sb.mounts_below());
    }
}

#[test]
fn unknown_user_is_one_line_exit_2_and_nothing_is_mounted() {
    if !can_mount() {
        return;
    }
    // Named as the flag, or as the spec's field when it came from there. A uid or gid of
    // 4294967295 is (uid_t)-1, "unchanged" to setresuid(2) (the child would stay root): refused
    // before anything runs, with the valid range.
    let range = "is out of range: an id is 0 to 4294967294";
    let cases = [
        (
            Some("no-such-user-lc"),
            None,
            "--user no-such-user-lc".to_string(),
        ),
        (
            None,
            Some("no-such-user-lc:1000"),
            "the spec's user no-such-user-lc:1000".to_string(),
        ),
        (
            Some("4242424"),
            Some("1000:1000"),
            "--user 4242424".to_string(),
        ),
        (
            Some("0:no-such-group-lc"),
            None,
            "--user 0:no-such-group-lc".to_string(),
        ),
        (
            Some("4294967295:0"),
            None,
            format!("--user \"4294967295:0\": uid 4294967295 {range}"),
        ),
        (
            None,
            Some("0:4294967295"),
            format!("user: \"0:4294967295\": gid 4294967295 {range}"),
        ),
    ];
    for driver in drivers() {
        for (user, spec_user, named) in &cases {
            let sb = sandbox("user-bad", *spec_user);
            let flags: Vec<&str> = user.map(|u| vec!["--user", u]).unwrap_or_default();
            let o = run(&sb, driver, &flags, "true");
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(2), "{driver} {user:?}: {}", show(&o));
            assert_eq!(err.lines().count(), 1, "one line: {err}");
            assert!(err.contains(named.as_str()), "{err}");
            assert!(!sb.path("store/v1/projects/user-bad").exists());
            assert!(sb.events().is_empty());
        }
    }
    // A spec's `user` with bad syntax is refused naming the field.
    let sb = sandbox("user-bad", Some("a b"));
    let o = run(&sb, "none", &[], "true");
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("user: "));
}

/// `npm install` as 1000:1000 (natively) into a node_modules a root `npm ci` filled.
#[test]
fn npm_install_as_1000_into_a_root_filled_node_modules() {
    if !can_mount() || !have_tool("npm") {
        return;
    }
    let sb = Sandbox::new();
    std::fs::set_permissions(sb.path(""), std::fs::Permissions::from_mode(0o755)).unwrap();
    sb.write_spec(
        "spec.toml",
        "project = \"user-npm\"\n[[cache]]\nid = \"node_modules\"\npreset = \"node_modules\"\n",
    );
    let w = npm_workdir(&sb, "ws");
    let spec = sb.path("spec.toml");
    let o = sb.run_flags(&spec, &w, &[], &["sh", "-c", "ls node_modules | wc -l"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(result(&o), "miss");
    // The workspace and a HOME are the user's (a platform gives the agent its own).
    let home = sb.path("home");
    std::fs::create_dir_all(&home).unwrap();
    for p in [
        &w,
        &w.join("package.json"),
        &w.join("package-lock.json"),
        &home,
    ] {
        std::os::unix::fs::chown(p, Some(1000), Some(1000)).unwrap();
    }
    let script = format!(
        "set -e; export HOME={}; id -u; rm -r node_modules/express; \
         echo x > node_modules/react/x; \
         npm install --no-audit --no-fund --cache $HOME/.npm is-number@7.0.0 >&2; \
         node -e \"require('react'); console.log(require('is-number')(7))\"",
        home.display()
    );
    let o = sb.run_flags(&spec, &w, &["--user", "1000:1000"], &["sh", "-c", &script]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(result(&o), "hit");
    assert!(
        String::from_utf8_lossy(&o.stdout).ends_with("\n1000\ntrue\n"),
        "{}",
        show(&o)
    );
    assert_canonical(&sb);
    assert!(sb.mounts_below().is_empty());
}
