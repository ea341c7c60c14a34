//! scripts/import-graph.sh: the crate's own modules form no cycle, and a cycle is found — through
//! a re-export, an inline path and a `super::` path — and fails the script. The documents: the
//! dependency list of docs/ARCHITECTURE.md is the script's output, and every relative link of
//! README.md, CONTRIBUTING.md and docs/*.md names a file (and heading) that exists.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};
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

/// The text between the import-graph markers of docs/ARCHITECTURE.md (the line holding the begin
/// marker excluded), or None when the markers are missing.
fn marked_block(doc: &str) -> Option<&str> {
    let begin = doc.find("<!-- import-graph: begin")?;
    let start = begin + doc[begin..].find('\n')? + 1;
    let end = start + doc[start..].find("<!-- import-graph: end -->")?;
    Some(&doc[start..end])
}

#[test]
fn architecture_md_lists_the_dependencies_the_script_prints() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("python3")
        .arg(root.join("scripts/import-graph.py"))
        .arg("--markdown")
        .arg("--src")
        .arg(root.join("src"))
        .output()
        .expect("python3 runs scripts/import-graph.py");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let expected = String::from_utf8(out.stdout).unwrap();
    // A parse that found nothing would print an empty block: the known arrows are there.
    assert!(
        expected.contains("\nstore ") && expected.contains("overlay"),
        "{expected}"
    );
    let doc = fs::read_to_string(root.join("docs/ARCHITECTURE.md")).unwrap();
    let block = marked_block(&doc)
        .expect("docs/ARCHITECTURE.md keeps its dependency list between import-graph markers");
    assert!(
        block == expected,
        "docs/ARCHITECTURE.md's dependency list differs from scripts/import-graph.py's; \
         regenerate it with `python3 scripts/import-graph.py --markdown --update-doc \
         docs/ARCHITECTURE.md`, or put this between the markers:\n{expected}\n(the doc has:\n{block})"
    );
}

/// GitHub's anchor of a heading: lowercase, spaces to `-`, other punctuation but `-`/`_` gone.
fn slug(heading: &str) -> String {
    heading
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .flat_map(char::to_lowercase)
        .collect()
}

/// The lines of a Markdown file outside fenced code blocks.
fn prose_lines(text: &str) -> Vec<&str> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            out.push(line);
        }
    }
    out
}

/// The anchors a Markdown file's headings get (`#`-headings; a repeated one gets `-1`, `-2`…).
fn anchors(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    for line in prose_lines(text) {
        let Some(h) = line.strip_prefix('#') else {
            continue;
        };
        let base = slug(h.trim_start_matches('#').trim());
        let mut a = base.clone();
        let mut n = 0;
        while !seen.insert(a.clone()) {
            n += 1;
            a = format!("{base}-{n}");
        }
    }
    seen
}

/// Every `[text](target)` target of a Markdown file's prose that is not a URL.
fn relative_links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose_lines(text) {
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            let Some(end) = rest.find(')') else { break };
            let target = rest[..end].trim();
            if !target.contains("://") && !target.starts_with("mailto:") && !target.is_empty() {
                out.push(target.to_string());
            }
            rest = &rest[end..];
        }
    }
    out
}

#[test]
fn relative_links_in_the_docs_resolve() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut docs: Vec<PathBuf> = vec![root.join("README.md"), root.join("CONTRIBUTING.md")];
    for e in fs::read_dir(root.join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            docs.push(p);
        }
    }
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in &docs {
        let text = fs::read_to_string(doc).unwrap_or_else(|e| panic!("{}: {e}", doc.display()));
        for link in relative_links(&text) {
            checked += 1;
            let (file, anchor) = match link.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (link.as_str(), None),
            };
            let target = if file.is_empty() {
                doc.clone()
            } else {
                doc.parent().unwrap().join(file)
            };
            let shown = format!("{}: ({link})", doc.strip_prefix(root).unwrap().display());
            if !target.exists() {
                broken.push(format!("{shown}: no file {}", target.display()));
                continue;
            }
            if let Some(a) = anchor.filter(|_| target.extension().is_some_and(|x| x == "md")) {
                let t = fs::read_to_string(&target).unwrap();
                if !anchors(&t).contains(a) {
                    broken.push(format!("{shown}: no heading with the anchor #{a}"));
                }
            }
        }
    }
    assert!(
        checked > 10,
        "only {checked} links found: the link parser is broken"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_link_checker_sees_a_broken_link_and_a_missing_anchor() {
    let text = "# The spec\n## Keys: what `key` covers\n```\n[not](a/link.md)\n```\n\
                see [x](spec.md#keys-what-key-covers) and [y](https://example.com) [z](#the-spec)\n";
    assert_eq!(
        relative_links(text),
        ["spec.md#keys-what-key-covers", "#the-spec"]
    );
    let a = anchors(text);
    assert!(
        a.contains("the-spec") && a.contains("keys-what-key-covers"),
        "{a:?}"
    );
    assert!(!a.contains("keys"));
}
