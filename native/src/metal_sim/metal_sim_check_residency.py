#!/usr/bin/env python3
"""Register-residency check of a .metal file's kernels, as Apple's compiler specialises them.

For every pipeline variant the planner can ask for (planner_variants' JSON lines: a kernel and
its function constants), the file is compiled as the simulator compiles it, but with the
function constants folded in as constexpr values (metal_sim_codegen.py --fold-constants) and
the simdgroup matrix operations as opaque calls on values (-DMFA_SIM_RESIDENCY_CHECK=1), to
LLVM IR, the variant's kernel alone (--only-kernel), optimised by a reduced form of LLVM's -O2
pipeline (see reduced_o2_pipeline). The variant fails if its kernel, or
any function it calls that the optimiser did not inline, keeps an array on the stack (an
`alloca` of an array type: a fragment array with a dynamic index, which on a GPU lives in
memory instead of registers) or, in code with matrix operations, carries a loop marked
llvm.loop.unroll.disable (what a runtime-unrolled `#pragma unroll` loop leaves: its remainder,
with dynamic indices).

Exits 1 naming each variant, kernel and finding.
"""

import argparse
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor


def defined_functions(ir):
    """Each function definition of the IR, by its mangled name."""
    pattern = re.compile(r"^define [^\n]*?@([^(\s]+)\(.*?^}", re.M | re.S)
    return {m.group(1): m.group(0) for m in pattern.finditer(ir)}


def kernel_functions(ir, kernel):
    """The bodies of the kernel's own function (the one the glue calls) and of every function it
    calls, directly or not, that the IR defines: a body the optimiser did not inline keeps its
    fragments where the kernel's does, so each must be checked."""
    functions = defined_functions(ir)
    # Itanium mangling: _Z, the name's length, the name, then its parameters.
    prefix = f"_Z{len(kernel)}{kernel}"
    pending = [f for f in functions if f.startswith(prefix)]
    seen = set(pending)
    while pending:
        for callee in re.findall(r"@([^(\s]+)\(", functions[pending.pop()]):
            if callee in functions and callee not in seen:
                seen.add(callee)
                pending.append(callee)
    return [functions[f] for f in sorted(seen)]


def unroll_disabled_nodes(ir):
    """Metadata node numbers that are loop IDs listing llvm.loop.unroll.disable."""
    nodes = dict(re.findall(r"^!(\d+) = (?:distinct )?(!\{.*\})$", ir, re.M))
    disable = {n for n, body in nodes.items() if '"llvm.loop.unroll.disable"' in body}
    return {n for n, body in nodes.items() if set(re.findall(r"!(\d+)", body)) & disable}


# What decides whether a fragment array reaches registers is -O2's simplification: the inliner,
# full unrolling of the loops with constant bounds, and SROA after them. The pipeline keeps all
# of it, as ThinLTO's pre-link pipeline (-O2's module pipeline without its optimisation stage)
# prints it, and of the optimisation stage only what can change the finding: the unroller that
# runtime-unrolls a `#pragma unroll` loop of unknown count (marking its remainder
# llvm.loop.unroll.disable), after the loop rotation it needs, and the SROA after it. It leaves
# out the vectorisers and the clean-up passes after them, and three simplification passes that
# took half of a large variant's time (correlated value propagation, GVN, jump threading): none
# of them promotes an array to registers, and less simplification can only keep more in memory,
# never less. The check's own test (tests/metal_sim/residency_findings.cmake) holds it to its
# findings. The 61 variants took 66 s on 2 cores of an AMD EPYC (Zen 3), against 92 s with all
# of -O2 but the first two.
REMOVED_PASSES = ("correlated-propagation", "gvn<>", "jump-threading")
LATE_UNROLLING = "function(loop(loop-rotate,loop-deletion),loop-unroll<O2>,sroa<preserve-cfg>)"


def reduced_o2_pipeline(opt):
    """ThinLTO's -O2 pre-link pipeline, as this opt prints it, without REMOVED_PASSES, then
    LATE_UNROLLING."""
    printed = subprocess.run(
        [opt, "-passes=thinlto-pre-link<O2>", "-print-pipeline-passes", "-disable-output"],
        input="",
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    kept = printed
    for name in REMOVED_PASSES:
        # An element of a comma-separated list, or the last one before a closing parenthesis.
        without = kept.replace(name + ",", "").replace("," + name + ")", ")")
        if without == kept:
            sys.exit(f"residency: {opt} printed no -O2 pre-link pipeline with {name}")
        kept = without
    return f"{kept},{LATE_UNROLLING}"


def check_variant(args, preprocessed, number, variant):
    stem = os.path.join(args.work_dir, f"variant{number}")
    generated = stem + ".cpp"
    subprocess.run(
        [
            sys.executable,
            args.codegen,
            preprocessed,
            "-o",
            generated,
            "--source",
            args.source,
            "--fold-constants",
            json.dumps(variant["constants"]),
            "--only-kernel",
            variant["kernel"],
        ],
        check=True,
    )
    # -O2 for the front end's output (no optnone, the optimiser's attributes), no LLVM pass.
    subprocess.run(
        [
            args.compiler,
            "-std=c++17",
            "-O2",
            "-Xclang",
            "-disable-llvm-passes",
            "-c",
            "-emit-llvm",
            *args.compile_options,
            # A pass's kernel does not run the code of the others, where the block constants it
            # leaves unset fold to 0: divisions by them there are dead, not errors.
            "-Wno-division-by-zero",
            generated,
            "-o",
            stem + ".bc",
        ],
        check=True,
    )
    subprocess.run(
        [
            args.opt,
            "-inline-threshold=100000",
            f"-passes={args.pipeline}",
            "-S",
            stem + ".bc",
            "-o",
            stem + ".ll",
        ],
        check=True,
    )
    with open(stem + ".ll", encoding="utf-8") as f:
        ir = f.read()
    bodies = kernel_functions(ir, variant["kernel"])
    where = f"{variant['kernel']} with function constants {json.dumps(variant['constants'])}"
    if not bodies:
        return [f"{where}: no definition of the kernel in the IR"]
    problems = []
    disabled = unroll_disabled_nodes(ir)
    loops = set()
    for body in bodies:
        for line in body.splitlines():
            array = re.search(r"= alloca (\[[^\]]*\])", line)
            if array:
                problems.append(f"{where}: an array stays in stack memory: {array.group(1)}")
        # A loop without matrix operations (a row pass's loop over rows, which LLVM may
        # runtime-unroll on its own) holds no fragments.
        if "residency_" in body:
            loops |= set(re.findall(r"!llvm\.loop !(\d+)", body)) & disabled
    if loops:
        problems.append(
            f"{where}: {len(loops)} loop(s) marked llvm.loop.unroll.disable "
            "(a `#pragma unroll` loop left runtime-unrolled)"
        )
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("source", help="the .metal file")
    parser.add_argument("--variants", required=True, help="planner_variants' output")
    parser.add_argument("--compiler", required=True)
    parser.add_argument("--opt", required=True, help="LLVM's opt, of the compiler's version")
    parser.add_argument("--codegen", required=True)
    parser.add_argument("--preprocess-flags", required=True, help="';'-separated")
    parser.add_argument("--compile-options", required=True, type=lambda s: s.split(";"))
    parser.add_argument("--work-dir", required=True)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    os.makedirs(args.work_dir, exist_ok=True)
    args.pipeline = reduced_o2_pipeline(args.opt)
    preprocessed = os.path.join(args.work_dir, "residency.ii")
    subprocess.run(
        [
            args.compiler,
            *args.preprocess_flags.split(";"),
            "-DMFA_SIM_RESIDENCY_CHECK=1",
            args.source,
            "-o",
            preprocessed,
        ],
        check=True,
    )
    with open(args.variants, encoding="utf-8") as f:
        variants = [json.loads(line) for line in f if line.strip()]
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(
            pool.map(lambda nv: check_variant(args, preprocessed, *nv), enumerate(variants))
        )
    problems = sorted(p for r in results for p in r)
    for p in problems:
        print(f"residency: {p}", file=sys.stderr)
    print(f"residency: {len(variants)} variants, {len(problems)} finding(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
