#!/usr/bin/env python3
"""Rejects recursion and calls through function pointers in a kernel translation unit.

Metal forbids both, and neither is visible to the preprocessor or to C++ type checking, so the
simulator build checks the LLVM IR of each compiled .metal file (-O0, nothing inlined): a cycle
in the call graph of the functions it defines is recursion; an indirect call is a call through a
function pointer. Prints `file: error: ...` and fails, or writes the stamp file.
"""

import argparse
import re
import shutil
import subprocess
import sys

DEFINE_RE = re.compile(r'^define\b[^@]*@("[^"]+"|[-\w.$]+)\(')
CALL_RE = re.compile(r'\b(?:call|invoke)\b.*?\s([@%]("[^"]+"|[-\w.$]+))\(')


def demangle(names):
    tool = (
        shutil.which("llvm-cxxfilt") or shutil.which("llvm-cxxfilt-16") or shutil.which("c++filt")
    )
    if not tool:
        return {n: n for n in names}
    result = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True)
    lines = result.stdout.splitlines()
    return dict(zip(names, lines)) if len(lines) == len(names) else {n: n for n in names}


def call_graph(ir):
    calls = {}  # defined function -> set of direct callees
    indirect = []  # functions that call through a pointer
    current = None
    for line in ir.splitlines():
        m = DEFINE_RE.match(line)
        if m:
            current = m.group(1).strip('"')
            calls[current] = set()
            continue
        if current is None:
            continue
        if line.startswith("}"):
            current = None
            continue
        for m in CALL_RE.finditer(line):
            callee = m.group(1)
            if callee.startswith("%"):
                indirect.append(current)
            else:
                calls[current].add(callee[1:].strip('"'))
    return calls, indirect


def find_cycle(calls):
    """A list of functions forming a cycle, or None (iterative DFS with colours)."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = {f: WHITE for f in calls}
    for root in calls:
        if colour[root] != WHITE:
            continue
        stack = [(root, iter(sorted(calls[root])))]
        path = [root]
        colour[root] = GREY
        while stack:
            function, callees = stack[-1]
            advanced = False
            for callee in callees:
                if callee not in calls:
                    continue  # declared only: not part of this unit
                if colour[callee] == GREY:
                    return path[path.index(callee) :] + [callee]
                if colour[callee] == WHITE:
                    colour[callee] = GREY
                    stack.append((callee, iter(sorted(calls[callee]))))
                    path.append(callee)
                    advanced = True
                    break
            if not advanced:
                colour[function] = BLACK
                stack.pop()
                path.pop()
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("ir")
    parser.add_argument("--source", required=True, help="the .metal file, for messages")
    parser.add_argument("--stamp", required=True)
    args = parser.parse_args()
    with open(args.ir, encoding="utf-8") as f:
        calls, indirect = call_graph(f.read())
    errors = []
    cycle = find_cycle(calls)
    if cycle:
        names = demangle(cycle)
        errors.append(
            "recursion, which Metal does not allow: " + " -> ".join(names[n] for n in cycle)
        )
    if indirect:
        names = demangle(sorted(set(indirect)))
        errors.append(
            "a call through a function pointer, which Metal does not allow, in "
            + ", ".join(names.values())
        )
    for error in errors:
        print(f"{args.source}: error: {error}", file=sys.stderr)
    if errors:
        return 1
    with open(args.stamp, "w", encoding="utf-8") as f:
        f.write("checked\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
