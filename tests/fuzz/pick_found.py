#!/usr/bin/env python3
"""Picks the inputs of a long fuzz run that reach the most code the seeds do not, into
tests/fuzz/found/.

Every fuzz run on small problems (scripts/hardening) starts from the seeds of make_corpus.py and
these inputs, and ctest's fuzz_attention_corpus replays both, so that a 30-second run in CI
starts where a long run ended instead of rediscovering it. libFuzzer's own merge keeps every
input that adds a feature (hundreds after half an hour); this keeps the few that add the most
coverage edges, one at a time (greedy set cover): each is run alone through the fuzzer's merge
step, whose control file lists the edges it reached (its "COV" lines).

    python3 tests/fuzz/pick_found.py build/fuzz/tests/fuzz/fuzz_attention build/fuzz/corpus

FUZZER is a libFuzzer build of the target (docs/fuzzing.md, "Long runs"); CANDIDATES are
directories of inputs it ran on small problems (a large-problem run decodes its inputs
differently). The current found/ inputs are candidates too, so a new pick replaces the old one.
Inputs are files named by their SHA-1, as libFuzzer names them. Re-run it after a long run, and
after a change to the input format (the old inputs would decode into other calls).
"""

import argparse
import concurrent.futures
import hashlib
import os
import pathlib
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
SEEDS = HERE / "corpus"
FOUND = HERE / "found"


def merge(fuzzer, into, sources, control=None):
    """libFuzzer's merge of the source directories into `into`, counting coverage edges only:
    each input that reaches an edge the ones before it did not is kept (the smallest first).
    With a control file, the edges each input added are listed there (its "COV" lines). True
    when the target ran every input without a finding."""
    command = [fuzzer, "-merge=1", "-use_counters=0", "-use_value_profile=0", "-timeout=60"]
    if control is not None:
        command.append(f"-merge_control_file={control}")
    command += [str(into), *map(str, sources)]
    run = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return run.returncode == 0


def edges(fuzzer, data):
    """The coverage edges (libFuzzer's PC indices) that one input reaches, alone in a merge, or
    None if the target failed on it (a finding: reproduce it by running the fuzzer on the
    input)."""
    with tempfile.TemporaryDirectory() as work:
        work = pathlib.Path(work)
        (work / "in").mkdir()
        (work / "out").mkdir()
        (work / "in" / "input").write_bytes(data)
        control = work / "control"
        if not merge(fuzzer, work / "out", [work / "in"], control) or not control.exists():
            return None
        reached = set()
        for line in control.read_text().splitlines():
            if line.startswith("COV "):
                reached.update(int(pc) for pc in line.split()[2:])
        return reached


def name(data):
    return hashlib.sha1(data).hexdigest()


def inputs(directory):
    return sorted(p for p in directory.iterdir() if p.is_file() and not p.name.startswith("."))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("fuzzer", help="the libFuzzer build of fuzz_attention")
    parser.add_argument("candidates", nargs="+", type=pathlib.Path, help="directories of inputs")
    parser.add_argument("--count", type=int, default=40, help="inputs to keep (default 40)")
    parser.add_argument(
        "--least-gain", type=int, default=5, help="stop at an input adding fewer edges (default 5)"
    )
    args = parser.parse_args()

    seeds = {p.read_bytes() for p in inputs(SEEDS)}
    # The candidates that reach some edge the smaller ones do not: a few hundred of thousands,
    # every edge of them all kept, each then measured alone.
    with tempfile.TemporaryDirectory() as work:
        directories = [d for d in [FOUND, *args.candidates] if d.is_dir()]
        if not merge(args.fuzzer, work, directories):
            sys.exit("pick_found: the target failed while merging the candidates")
        candidates = {p.read_bytes() for p in inputs(pathlib.Path(work))}
    candidates -= seeds
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        measured = [*seeds, *candidates]
        reached = dict(zip(measured, pool.map(lambda data: edges(args.fuzzer, data), measured)))
    failed = [data for data, e in reached.items() if e is None]
    for data in failed:
        print(f"pick_found: the target failed on input {name(data)}; left out", file=sys.stderr)

    covered = set().union(*(reached[data] or set() for data in seeds))
    from_seeds = len(covered)
    left = {data: reached[data] - covered for data in candidates if reached[data]}
    picked = []
    while left and len(picked) < args.count:
        # The most new edges; of equals, the shortest input (then any, the same every run).
        best = max(left, key=lambda data: (len(left[data] - covered), -len(data), data))
        if len(left[best] - covered) < args.least_gain:
            break
        covered |= left.pop(best)
        picked.append(best)

    FOUND.mkdir(exist_ok=True)
    for old in inputs(FOUND):
        old.unlink()
    for data in picked:
        (FOUND / name(data)).write_bytes(data)
    print(
        f"pick_found: {len(picked)} of {len(candidates)} candidates into {FOUND}: "
        f"{from_seeds} edges from the {len(seeds)} seeds, {len(covered)} with them"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
