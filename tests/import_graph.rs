//! scripts/import-graph.sh: the crate's own modules form no cycle, and a cycle is found — through
//! a re-export, an inline path and a `super::` path — and fails the script.

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

fn graph(src: &Path) -> Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/import-graph.py");
    Command::new("python3")
        .arg(&script)
        .arg("--files")
        .arg("--src")
        .arg(src)
        .output()
        .expect("python3 runs scripts/import-graph.py")
}

fn write(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, text).unwrap();
}

#[test]
fn the_crate_has_no_import_cycle() {
    let out = graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "import cycles in src/:\n{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The arrows the architecture rests on are seen (so a silent parse failure cannot pass).
    assert!(stdout.contains("  remote -> "), "{stdout}");
    let store = stdout
        .lines()
        .find(|l| l.starts_with("  store -> "))
        .unwrap();
    assert!(
        store.contains("overlay") && !store.contains("remote"),
        "{store}"
    );
}

#[test]
fn a_cycle_through_a_reexport_fails_the_script() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path();
    write(src, "lib.rs", "pub mod low;\npub mod high;\n");
    // low/mod.rs re-exports Port from low/port.rs; high names it through the front door.
    write(src, "low/mod.rs", "mod port;\npub use port::Port;\n");
    write(
        src,
        "low/port.rs",
        "pub trait Port {}\n// crate::high::Remote in a comment is no arrow\n",
    );
    write(
        src,
        "high.rs",
        "use crate::low::Port;\npub struct Remote;\nimpl Port for Remote {}\n",
    );
    let out = graph(src);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("high.rs -> low/port.rs"),
        "the arrow goes to the file that defines the item"
    );
    // The low layer names the high one with an inline path: a cycle between modules and files.
    write(
        src,
        "low/port.rs",
        "pub trait Port {}\npub fn f() -> Option<crate::high::Remote> { None }\n",
    );
    let out = graph(src);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("cycle between modules: high <-> low"),
        "{stderr}"
    );
    assert!(stderr.contains("high.rs, low/port.rs"), "{stderr}");
    // A test module may name anything: cfg(test) code draws no arrow.
    write(
        src,
        "low/port.rs",
        "pub trait Port {}\n#[cfg(test)]\nmod tests {\n    use crate::high::Remote;\n}\n",
    );
    assert!(graph(src).status.success());
    // Siblings naming each other through `super::` are a cycle too.
    write(
        src,
        "low/mod.rs",
        "mod port;\nmod a;\nmod b;\npub use port::Port;\n",
    );
    write(src, "low/a.rs", "pub fn a() { super::b::b() }\n");
    write(src, "low/b.rs", "pub fn b() { super::a::a() }\n");
    let out = graph(src);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("low/a.rs, low/b.rs"), "{stderr}");
}
