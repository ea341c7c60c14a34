#!/usr/bin/env python3
"""The module dependency arrows of src/, and whether they form a cycle.

Reads every src/**/*.rs, strips comments, string literals and `#[cfg(test)]` items (a test may
use what its module may not), and collects the paths each file names: `use` trees and inline
paths starting with `crate::`, `super::`, `self::`, a `use`d module alias or a child module
(`gc::plan` in store/mod.rs). Each path is resolved to the file that defines the item, through
`pub use` re-exports (`crate::store::Mount` is store/mount.rs), so an arrow points where the code
it needs lives.

Two graphs:
* modules: the crate's top-level modules (store/, remote/, serve/, overlay/, key.rs, …); an
  arrow `a -> b` means some file of `a` names an item of `b`;
* files: one node per file. A module's root file (mod.rs, or x.rs beside x/) may name items of
  its own children without an arrow: it declares and wires them, as a front door re-exports
  them. Every other naming is an arrow, so a child that needs its parent's type and a sibling
  that needs the child back is a cycle.

Usage: scripts/import-graph.py [--files] [--src DIR]
       scripts/import-graph.py --markdown [--update-doc FILE]
Prints the module arrows (with --files also the file arrows) on stdout and each cycle on stderr,
and exits 1 when either graph has a cycle, 0 otherwise. `--markdown` prints the module arrows as
the block docs/ARCHITECTURE.md holds between its import-graph markers (tests/import_graph.rs
checks the two are equal); `--update-doc FILE` rewrites that block of FILE in place.
"""

import os
import re
import sys
from collections import defaultdict

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
ITEM_RE = re.compile(
    r"^\s*(?:pub(?:\s*\([^)]*\))?\s+)?(?:unsafe\s+|async\s+|const\s+|extern\s+\"[^\"]*\"\s+)*"
    r"(fn|struct|enum|trait|type|const|static|union|mod|macro_rules!)\s+(" + IDENT + ")",
    re.M,
)
MOD_DECL_RE = re.compile(r"^\s*(?:pub(?:\s*\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*;", re.M)


def strip(src):
    """`src` without comments, string/char literals (kept as empty quotes) and cfg(test) items."""
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        start = i
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if src.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif src.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
            out.append("\n" * src.count("\n", start, i))
        elif c == "r" and re.match(r'r#*"', src[i:i + 10]) and not re.match(r"\w", src[i - 1:i] or " "):
            m = re.match(r'r(#*)"', src[i:])
            end = '"' + m.group(1)
            j = src.find(end, i + len(m.group(0)))
            i = n if j < 0 else j + len(end)
            out.append('""' + "\n" * src.count("\n", start, i))
        elif c == "b" and src.startswith('b"', i) and not re.match(r"\w", src[i - 1:i] or " "):
            i = skip_string(src, i + 1)
            out.append('""' + "\n" * src.count("\n", start, i))
        elif c == '"':
            i = skip_string(src, i)
            out.append('""' + "\n" * src.count("\n", start, i))
        elif c == "'":
            # A char literal ('a', '\n', '\u{1F600}') or a lifetime ('a).
            m = re.match(r"'(\\(?:u\{[0-9a-fA-F]+\}|x[0-9a-fA-F]{2}|.)|[^\\'])'", src[i:])
            if m:
                out.append("' '")
                i += len(m.group(0))
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return drop_cfg_test("".join(out))


def skip_string(src, i):
    """Index after the string literal whose opening quote is at `i`."""
    i += 1
    while i < len(src):
        if src[i] == "\\":
            i += 2
        elif src[i] == '"':
            return i + 1
        else:
            i += 1
    return i


def drop_cfg_test(src):
    """`src` without the items marked `#[cfg(test)]` (a test module, a test-only fn or use)."""
    while True:
        m = re.search(r"#\s*\[\s*cfg\s*\(\s*test\s*\)\s*\]", src)
        if not m:
            return src
        i = m.end()
        depth = 0
        while i < len(src):
            c = src[i]
            if c == "[" and depth == 0 and src[i - 1] == "#":
                # Another attribute on the same item.
                j = src.find("]", i)
                i = j + 1
                continue
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    i += 1
                    break
            elif c == ";" and depth == 0:
                i += 1
                break
            i += 1
        src = src[: m.start()] + "\n" * src.count("\n", m.start(), i) + src[i:]


class Module:
    def __init__(self, path, file):
        self.path = path  # tuple of segments below crate
        self.file = file  # path relative to src/
        self.text = ""
        self.items = set()
        self.children = set()
        self.uses = []  # (absolute path tuple, is_glob, alias or None, is_pub)
        self.is_root = False  # mod.rs, lib.rs or x.rs beside x/


def module_files(src):
    """{module path tuple: file} for every .rs file under `src` (lib.rs = the crate root)."""
    mods = {}
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), src)
            parts = rel[:-3].split(os.sep)
            if parts == ["main"]:
                path = ("<main>",)
            elif parts == ["lib"]:
                path = ()
            elif parts[-1] == "mod":
                path = tuple(parts[:-1])
            else:
                path = tuple(parts)
            mods[path] = rel
    return mods


def parse_use_tree(s):
    """Flattens a use tree `a::{b, c::{d as e}, f::*}` into [(segments, alias, glob)]."""
    s = re.sub(r"\s+", "", s)
    res = []

    def walk(prefix, t):
        parts = split_top(t)
        for p in parts:
            if not p:
                continue
            brace = p.find("{")
            if brace >= 0:
                head = p[:brace].rstrip(":")
                segs = prefix + ([x for x in head.split("::") if x] if head else [])
                walk(segs, p[brace + 1 : -1])
            else:
                alias = None
                if "as" in p and re.search(r"(?<=[\w}])as(?=\w)", p):
                    p, alias = re.split(r"(?<=[\w}])as(?=\w)", p, maxsplit=1)
                segs = prefix + [x for x in p.split("::") if x]
                if segs and segs[-1] == "*":
                    res.append((segs[:-1], None, True))
                else:
                    res.append((segs, alias, False))

    walk([], s)
    return res


def split_top(t):
    parts, depth, cur = [], 0, ""
    for c in t:
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    parts.append(cur)
    return parts


def main():
    args = sys.argv[1:]
    show_files = "--files" in args
    src = "src"
    if "--src" in args:
        src = args[args.index("--src") + 1]
    paths = module_files(src)
    mods = {p: Module(p, f) for p, f in paths.items()}
    for p, m in mods.items():
        with open(os.path.join(src, m.file), encoding="utf-8") as fh:
            m.text = strip(fh.read())
        for kind, name in ITEM_RE.findall(m.text):
            m.items.add(name)
        m.children = set(MOD_DECL_RE.findall(m.text))
        m.is_root = bool(m.children)
    # Only the modules the crate declares outside cfg(test) (run/tests.rs and the like go).
    live, todo = set(), [(), ("<main>",)]
    while todo:
        p = todo.pop()
        if p in mods and p not in live:
            live.add(p)
            base = p if p != ("<main>",) else None
            if base is not None:
                todo.extend(base + (c,) for c in mods[p].children)
    mods = {p: m for p, m in mods.items() if p in live}
    if "--stats" in args:
        return stats(src, mods)

    def base_of(m):
        """The module a relative path starts from (a `mod x { … }` inside a file is not tracked)."""
        return m.path if m.path != ("<main>",) else ()

    def absolute(m, segs):
        """Absolute segments (below crate) of path `segs` named in module `m`, or None."""
        if not segs:
            return None
        cur = list(base_of(m))
        first = segs[0]
        if first in ("crate", "layercache"):
            return segs[1:]
        if first == "self":
            return cur + segs[1:]
        if first == "super":
            i = 0
            while i < len(segs) and segs[i] == "super":
                cur = cur[:-1]
                i += 1
            return cur + segs[i:]
        if first in m.children:
            return cur + segs
        if first in m.aliases:
            return list(m.aliases[first]) + segs[1:]
        return None  # std::, an external crate, a local variable

    def find(modpath, name, seen):
        """The module defining `name` as seen in module `modpath` (through its uses), or None."""
        if (modpath, name) in seen:
            return None
        seen.add((modpath, name))
        mod = mods[modpath]
        if name in mod.items:
            return modpath
        for target, alias, glob, _ in mod.uses:
            if not glob and target and (alias or target[-1]) == name:
                return resolve(list(target), seen)
        for target, _, glob, _ in mod.uses:
            if glob and target in mods:
                r = find(target, name, seen)
                if r is not None:
                    return r
        return None

    def resolve(segs, seen=None):
        """The module (path tuple) whose file defines the item at absolute `segs`."""
        seen = set() if seen is None else seen
        k = len(segs)
        while k > 0 and tuple(segs[:k]) not in mods:
            k -= 1
        if tuple(segs[:k]) not in mods:
            return None
        modpath = tuple(segs[:k])
        rest = segs[k:]
        if not rest:
            return modpath
        r = find(modpath, rest[0], seen)
        if r is not None and len(rest) > 1 and r + (rest[0],) in mods:
            return resolve(list(r) + rest, seen)
        return r if r is not None else modpath

    # Pass 1: use statements (aliases first, so inline paths can use them).
    use_re = re.compile(r"(?:^|[;{}\s])(pub(?:\s*\([^)]*\))?\s+)?use\s+([^;]+);")
    for m in mods.values():
        m.aliases = {}
        for c in m.children:
            m.aliases[c] = base_of(m) + (c,)
        raw = []
        for mt in use_re.finditer(m.text):
            is_pub = bool(mt.group(1)) and "(" not in (mt.group(1) or "")
            for segs, alias, glob in parse_use_tree(mt.group(2)):
                raw.append((segs, alias, glob, is_pub))
        m.raw_uses = raw
        # Two rounds: `use crate::overlay; use overlay::options;` style chains.
        for _ in range(2):
            for segs, alias, glob, _ in raw:
                a = absolute(m, segs)
                if a is None or glob:
                    continue
                if segs and segs[-1] == "self":
                    a = a[:-1]
                name = alias or (a[-1] if a else None)
                if name and tuple(a) in mods:
                    m.aliases[name] = tuple(a)
    for m in mods.values():
        m.uses = []
        for segs, alias, glob, is_pub in m.raw_uses:
            a = absolute(m, segs)
            if a is None:
                continue
            if a and a[-1] == "self":
                a = a[:-1]
            m.uses.append((tuple(a), alias, glob, is_pub))

    # Pass 2: every path each file names.
    path_re = re.compile(r"(?<![\w:])((?:" + IDENT + r")(?:\s*::\s*" + IDENT + r")+)")
    file_edges = defaultdict(set)
    for m in mods.values():
        named = [list(u[0]) for u in m.uses]
        for mt in path_re.finditer(m.text):
            segs = [s for s in re.split(r"\s*::\s*", mt.group(1))]
            a = absolute(m, segs)
            if a is not None:
                named.append(a)
        for a in named:
            target = resolve(a)
            if target is None or target == m.path:
                continue
            if m.is_root and target[: len(base_of(m))] == base_of(m) and target != base_of(m):
                continue  # a module root wiring its own children
            if m.path == () or target == ():
                continue  # lib.rs declares the modules; nothing names the crate root's items
            file_edges[m.path].add(target)

    def top(p):
        return p[0] if p else "<lib>"

    mod_edges = defaultdict(set)
    for a, bs in file_edges.items():
        for b in bs:
            if top(a) != top(b):
                mod_edges[top(a)].add(top(b))

    def cycles(edges):
        """Strongly connected components with more than one node (Tarjan)."""
        index, low, stack, on, out = {}, {}, [], set(), []
        counter = [0]
        nodes = set(edges) | {b for bs in edges.values() for b in bs}

        def visit(v):
            index[v] = low[v] = counter[0]
            counter[0] += 1
            stack.append(v)
            on.add(v)
            for w in sorted(edges.get(v, ())):
                if w not in index:
                    visit(w)
                    low[v] = min(low[v], low[w])
                elif w in on:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))

        sys.setrecursionlimit(10000)
        for v in sorted(nodes):
            if v not in index:
                visit(v)
        return out

    def fname(p):
        return mods[p].file if p in mods else "::".join(p)

    mc = cycles(mod_edges)
    fc = cycles({k: v for k, v in file_edges.items()})
    if "--markdown" in args:
        block = markdown(mod_edges)
        if "--update-doc" in args:
            return update_doc(args[args.index("--update-doc") + 1], block)
        print(block, end="")
        return 1 if mc or fc else 0
    print("module arrows (a -> what a names):")
    for a in sorted(mod_edges):
        print(f"  {a} -> {', '.join(sorted(mod_edges[a]))}")
    if show_files:
        print("file arrows:")
        for a in sorted(file_edges, key=fname):
            print(f"  {fname(a)} -> {', '.join(sorted(fname(b) for b in file_edges[a]))}")
    for c in mc:
        print(f"cycle between modules: {' <-> '.join(c)}", file=sys.stderr)
    for c in fc:
        names = [fname(p) for p in c]
        print(f"cycle between files ({len(names)}): {', '.join(names)}", file=sys.stderr)
        # One arrow path per cycle member, to show where it closes.
        members = set(c)
        for p in c:
            inside = sorted(fname(q) for q in file_edges.get(p, ()) if q in members)
            print(f"    {fname(p)} -> {', '.join(inside)}", file=sys.stderr)
    if mc or fc:
        print(f"import-graph: {len(mc)} module cycle(s), {len(fc)} file cycle(s)", file=sys.stderr)
        return 1
    print("import-graph: no cycles")
    return 0


BEGIN_MARK = "<!-- import-graph: begin"
END_MARK = "<!-- import-graph: end -->"


def markdown(mod_edges):
    """The module arrows as the fenced block docs/ARCHITECTURE.md keeps between its markers:
    one `a -> b, c` line per module that names another, names padded to one column."""
    width = max((len(a) for a in mod_edges), default=0)
    lines = [f"{a.ljust(width)} -> {', '.join(sorted(mod_edges[a]))}" for a in sorted(mod_edges)]
    return "```\n" + "\n".join(lines) + "\n```\n"


def update_doc(path, block):
    """Replaces the text between the import-graph markers of `path` with `block`; exits 1 when
    the file has no such pair of markers."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    b = text.find(BEGIN_MARK)
    e = text.find(END_MARK, b)
    if b < 0 or e < 0:
        print(f"import-graph: {path} has no '{BEGIN_MARK} … -->' / '{END_MARK}' markers",
              file=sys.stderr)
        return 1
    start = text.index("\n", b) + 1
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text[:start] + block + text[e:])
    print(f"import-graph: {path}: dependency block rewritten")
    return 0


FN_RE = re.compile(r"(?<![\w])fn\s+(" + IDENT + r")")


def stats(src, mods):
    """Figures for a structure review: `pub` items per top-level module, the longest
    functions (lines from `fn` to its closing brace, tests excluded) and `unsafe` blocks per
    file (sys.rs or sys/ apart)."""
    pubs = defaultdict(int)
    outside = defaultdict(int)
    pub_mod = re.compile(r"^\s*pub\s+mod\s+(" + IDENT + r")\s*;", re.M)
    reachable = {()}
    for p in sorted(mods, key=len):
        if p in reachable:
            reachable |= {p + (c,) for c in pub_mod.findall(mods[p].text)}
    fns = []
    unsafe = defaultdict(int)
    for p, m in mods.items():
        top = p[0] if p else "<lib>"
        pubs[top] += len(re.findall(r"(?<![\w(])pub\s+(?!\()(?:(?:unsafe|async|const)\s+)*"
                                    r"(?:fn|struct|enum|trait|type|const|static|mod|use|"
                                    r"[a-z_][a-z0-9_]*\s*:)", m.text))
        if p in reachable:
            # What a user of the library can name: the module-level items of public modules
            # (rustfmt puts them at column 0; methods and fields are not counted) and each
            # name a `pub use` re-exports there (a glob counts once).
            outside[top] += len(re.findall(
                r"^pub\s+(?:(?:unsafe|async|const)\s+)*"
                r"(?:fn|struct|enum|trait|type|const|static|mod)\b", m.text, re.M))
            for u in re.findall(r"^pub\s+use\s+([^;]+);", m.text, re.M):
                outside[top] += len(parse_use_tree(u))
        text = m.text
        for mt in FN_RE.finditer(text):
            i = text.find("{", mt.end())
            semi = text.find(";", mt.end())
            if i < 0 or (0 <= semi < i):
                continue  # a declaration without a body
            depth, j = 0, i
            while j < len(text):
                if text[j] == "{":
                    depth += 1
                elif text[j] == "}":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            first = text.count("\n", 0, mt.start()) + 1
            last = text.count("\n", 0, j) + 1
            fns.append((last - first + 1, f"{m.file}:{first}", mt.group(1)))
        if m.file != "sys.rs" and not m.file.startswith("sys/"):
            n = len(re.findall(r"(?<![\w])unsafe\s*\{", text))
            if n:
                unsafe[m.file] += n
    print("pub items (outside cfg(test); fields, fns, types, uses, mods):")
    for k in sorted(pubs):
        print(f"  {k}: {pubs[k]}")
    print(f"  total: {sum(pubs.values())}")
    print("names a library user can reach (module-level pub items of public modules, re-exports):")
    for k in sorted(outside):
        print(f"  {k}: {outside[k]}")
    print(f"  total: {sum(outside.values())}")
    print("longest functions (lines):")
    for n, where, name in sorted(fns, reverse=True)[:15]:
        print(f"  {n:4} {name} ({where})")
    print(f"unsafe blocks outside sys: {sum(unsafe.values())} in {len(unsafe)} files")
    for f in sorted(unsafe):
        print(f"  {f}: {unsafe[f]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
