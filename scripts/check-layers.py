#!/usr/bin/env python3
"""Check the layer rule of docs/design.md on every file under src/.

Layers, bottom up (a file may use only layers below its own, or its own
module):

    1 sys     OS facts
    2 base    status, errors, logging, clock, configuration, host kernels
    3 gdr     GPU memory and the CUDA driver
    4 boot, intra, inter   siblings: none uses another
    5 core    communicator, plans, executors
    6 api     the public entry points

include/hcoll.h (the contract) and the generated hc_build.h are usable
everywhere.

Two checks:
  * includes: every #include "x/..." in src/ names a module that the
    including file's layer may use;
  * calls (when object files are given): every undefined symbol of an
    object that another object of the library defines is a call along the
    same rule, and no set of files calls each other in a loop.

usage: scripts/check-layers.py [--objects BUILD_DIR]
Exit 0 when the rule holds, 1 with one line per violation otherwise.
"""
import argparse
import os
import re
import subprocess
import sys

LAYERS = {"sys": 1, "base": 2, "gdr": 3, "boot": 4, "intra": 4, "inter": 4, "core": 5, "api": 6}
ANYWHERE = {"hcoll.h", "hc_build.h"}
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def module_of(path):
    """src/inter/ib/qp.c -> 'inter'; None outside src/."""
    parts = path.split(os.sep)
    if len(parts) < 3 or parts[0] != "src":
        return None
    return parts[1]


def may_use(user, used):
    if user == used:
        return True
    return LAYERS[used] < LAYERS[user]


def source_files(root):
    for d, _, files in os.walk(os.path.join(root, "src")):
        for f in sorted(files):
            if f.endswith((".c", ".h", ".cu")):
                yield os.path.relpath(os.path.join(d, f), root)


def check_includes(root, problems):
    for rel in source_files(root):
        mod = module_of(rel)
        if mod not in LAYERS:
            problems.append(f"{rel}: module '{mod}' has no layer (add it to the rule)")
            continue
        with open(os.path.join(root, rel), encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                m = INCLUDE_RE.match(line)
                if not m:
                    continue
                inc = m.group(1)
                if inc in ANYWHERE:
                    continue
                if "/" not in inc:
                    # A header beside the file: same module by construction.
                    continue
                used = inc.split("/")[0]
                if used not in LAYERS:
                    problems.append(f"{rel}:{lineno}: includes \"{inc}\" outside every layer")
                elif not may_use(mod, used):
                    problems.append(
                        f"{rel}:{lineno}: {mod} (layer {LAYERS[mod]}) includes \"{inc}\" "
                        f"from {used} (layer {LAYERS[used]})")


def nm(path, *flags):
    out = subprocess.run(["nm", *flags, path], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def check_calls(root, objdir, problems):
    objs = {}
    for d, _, files in os.walk(os.path.join(objdir, "src")):
        for f in files:
            if f.endswith(".o"):
                obj = os.path.join(d, f)
                rel = os.path.relpath(obj, objdir)[:-2] + ".c"
                # An object whose source is gone (a file split or renamed
                # since the last build) is no longer part of the library.
                if os.path.exists(os.path.join(root, rel)):
                    objs[rel] = obj
    if not objs:
        problems.append(f"{objdir}: no object files under src/ (build first)")
        return
    defined, undefined = {}, {}
    for rel, obj in objs.items():
        undefined[rel] = set()
        for line in nm(obj, "-g"):
            fields = line.split()
            if len(fields) == 2 and fields[0] == "U":
                undefined[rel].add(fields[1])
            elif len(fields) == 3 and fields[1] not in "Uuvw":
                defined[fields[2]] = rel
    edges = {rel: set() for rel in objs}
    for rel, syms in undefined.items():
        mod = module_of(rel)
        for s in sorted(syms):
            target = defined.get(s)
            if target is None or target == rel:
                continue
            edges[rel].add(target)
            tmod = module_of(target)
            if mod in LAYERS and tmod in LAYERS and not may_use(mod, tmod):
                problems.append(f"{rel}: {mod} (layer {LAYERS[mod]}) calls {s} in {target} "
                                f"({tmod}, layer {LAYERS[tmod]})")
    for scc in strongly_connected(edges):
        if len(scc) > 1:
            problems.append("files call each other in a loop: " + " <-> ".join(sorted(scc)))


def strongly_connected(edges):
    """Tarjan's algorithm, iterative."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = [0]
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(edges[nxt]))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                out.append(comp)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--objects", help="build directory whose src/**/*.o to check for calls")
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    problems = []
    check_includes(root, problems)
    if args.objects:
        check_calls(root, os.path.abspath(args.objects), problems)
    for p in problems:
        print(p)
    if problems:
        print(f"layer rule: {len(problems)} violation(s); see docs/design.md, 'Layers'")
        return 1
    print("layer rule: holds" + (" (includes and calls)" if args.objects else " (includes)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
