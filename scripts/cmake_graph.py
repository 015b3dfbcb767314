#!/usr/bin/env python3
"""Prints the dependency graph of oscarkv's own CMake targets, read from the CMakeLists files.

  python3 scripts/cmake_graph.py            # text: one line per target, what it links, each
                                            # after everything it links (fails on a cycle)
  python3 scripts/cmake_graph.py --mermaid  # the graph block of docs/ARCHITECTURE.md §5

Edges are every oscarkv::* name in a target's target_link_libraries (PUBLIC and PRIVATE alike)
and, for the `oscarkv` tool, the optional modules cli/CMakeLists.txt links when they are built.
Test executables, benchmarks' mains and fuzzers are left out.
"""
import glob
import os
import re
import sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
files = sorted(glob.glob(os.path.join(root, "**", "CMakeLists.txt"), recursive=True))
files = [f for f in files if not os.path.relpath(f, root).split(os.sep)[0].startswith("build")
         and "package_consumer" not in f]
alias, edges = {}, {}
for f in files:
    text = open(f).read()
    for m in re.finditer(r"add_library\((oscarkv::\w+) ALIAS (\w+)\)", text):
        alias[m.group(2)] = m.group(1)
    for m in re.finditer(r"target_link_libraries\((\w+)([^)]*)\)", text, re.S):
        edges.setdefault(m.group(1), set()).update(re.findall(r"oscarkv::\w+", m.group(2)))
    for m in re.finditer(r"foreach\(lib IN ITEMS([^)]*)\)", text, re.S):
        edges.setdefault("oscarkv", set()).update(re.findall(r"oscarkv::\w+", m.group(1)))

keep = {}
for target, deps in edges.items():
    name = alias.get(target, target)
    if not name.startswith("oscarkv") or name.endswith("_test") or not deps:
        continue
    if target not in alias and target not in ("oscarkv", "oscarkvd"):
        continue  # executables other than the two programs users run
    keep[name] = sorted(deps)

def short(n):
    return n.replace("oscarkv::", "")

if "--mermaid" in sys.argv:
    print("graph TD")
    for name in sorted(keep):
        for d in keep[name]:
            print(f"  {short(name)} --> {short(d)}")
else:
    depth = {}

    def level(n, seen=()):
        if n not in keep:
            return 0
        if n not in depth:
            if n in seen:
                raise SystemExit(f"dependency cycle through {n}")
            depth[n] = 1 + max(level(d, seen + (n,)) for d in keep[n])
        return depth[n]

    leaves = sorted({d for deps in keep.values() for d in deps if d not in keep})
    print(f"{', '.join(short(d) for d in leaves)} -> (third-party only)")
    for name in sorted(keep, key=lambda n: (level(n), n)):
        print(f"{short(name):16s} -> {', '.join(short(d) for d in keep[name])}")
