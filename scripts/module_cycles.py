#!/usr/bin/env python3
"""The import graph of each crate's modules, and its cycles.

A module (a file under a crate's src/) depends on another when its code names a path into
it: `use crate::a::b`, `crate::a::b::f()`, `super::x`, `self::x` from a mod.rs. Test
modules (`#[cfg(test)] mod tests { ... }` to the end of the file) are left out: a test may
reach anywhere. Strongly connected components with more than --max files are reported
(Tarjan's algorithm); the exit status is 1 when there is one.

usage: scripts/module_cycles.py [--max N] [CRATE_SRC_DIR ...]
       (default: src and every crates/*/src of the workspace)
"""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE_GROUP = re.compile(r"\buse\s+(crate|super|self)::\{([^;]*)\};", re.S)


def module_files(src):
    """{module path tuple: file} for every .rs file under src."""
    mods = {}
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            full = os.path.join(dirpath, f)
            rel = os.path.relpath(full, src)[:-3].split(os.sep)
            if rel in (["lib"], ["main"]):
                rel = []
            elif rel[-1] == "mod":
                rel = rel[:-1]
            elif rel[0] == "bin":
                continue
            mods[tuple(rel)] = full
    return mods


def without_tests(text):
    """The text before a `#[cfg(test)]` test module, comments blanked."""
    m = re.search(r"#\[cfg\(test\)\]\s*(pub(\(\w+\))?\s+)?mod\s+\w+\s*\{", text)
    if m:
        text = text[: m.start()]
    return re.sub(r"//[^\n]*", "", text)


def resolve(mods, here, anchor, segments):
    """The longest module path that `anchor::segments` from module `here` names."""
    if anchor == "crate":
        base = []
    elif anchor == "self":
        base = list(here)
    else:
        base = list(here[:-1])
    path = base + segments
    while path and tuple(path) not in mods:
        path.pop()
    return tuple(path)


def paths_in(text):
    """(anchor, segments) of every path named, expanding `use x::{a, b::c}` groups."""
    for m in USE_GROUP.finditer(text):
        anchor, body = m.group(1), m.group(2)
        for item in re.split(r",", re.sub(r"\{[^{}]*\}", "", body)):
            item = item.strip()
            if item:
                yield anchor, [s for s in item.split("::") if s and s != "self"]
    for m in PATH.finditer(text):
        yield m.group(1), [s for s in m.group(2).split("::") if s]


def graph(src):
    mods = module_files(src)
    edges = {m: set() for m in mods}
    for here, f in mods.items():
        with open(f, encoding="utf-8") as fh:
            text = without_tests(fh.read())
        for anchor, segments in paths_in(text):
            target = resolve(mods, here, anchor, segments)
            # A module's own submodules and its parents' declarations are structure, not
            # dependencies: only paths into another module's items count.
            if target != here and target != () and target[: len(here)] != here:
                edges[here].add(target)
    return mods, edges


def components(edges):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
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
            out.append(comp)

    sys.setrecursionlimit(10000)
    for v in edges:
        if v not in index:
            visit(v)
    return out


def main():
    args = sys.argv[1:]
    limit = 3
    if "--max" in args:
        i = args.index("--max")
        limit = int(args[i + 1])
        del args[i : i + 2]
    srcs = args or [os.path.join(ROOT, "src")] + sorted(
        os.path.join(ROOT, "crates", c, "src")
        for c in os.listdir(os.path.join(ROOT, "crates"))
        if os.path.isdir(os.path.join(ROOT, "crates", c, "src"))
    )
    failed = False
    for src in srcs:
        mods, edges = graph(src)
        name = os.path.relpath(src, ROOT)
        big = [c for c in components(edges) if len(c) > 1]
        worst = max((len(c) for c in big), default=1)
        print(f"{name}: {len(mods)} modules, largest cycle {worst} files")
        for comp in sorted(big, key=len, reverse=True):
            files = sorted(os.path.relpath(mods[m], ROOT) for m in comp)
            flag = "TOO LARGE" if len(comp) > limit else "ok"
            print(f"  cycle of {len(comp)} ({flag}): {' '.join(files)}")
            failed |= len(comp) > limit
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
