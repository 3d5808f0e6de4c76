#!/usr/bin/env python3
"""Check the stub SDK headers of the Metal host against Apple's published API.

The Objective-C host is type-checked on Linux against hand-written stubs of Foundation and
Metal (native/src/metal/typecheck/sdk). A stub that invents a selector, or gets an enum value
wrong, would let a host pass here and fail on a Mac. Apple publishes every selector of these
frameworks, and their enum values, in metal-cpp (Apache-2.0): `_MTL_PRIVATE_DEF_SEL` /
`_NS_PRIVATE_DEF_SEL` strings, `Name = value,` enumerators and `extern "C"` functions.

metal-cpp itself is not committed. Instead metal_cpp_subset.txt holds exactly the entries the
stubs declare, as found in metal-cpp, and this script:

  check_selectors.py --stubs DIR --subset FILE
      verifies that every selector, enum value and function the stubs declare is in FILE with
      the same value, and that FILE lists nothing the stubs no longer declare;
  check_selectors.py --stubs DIR --subset FILE --metal-cpp DIR [--write]
      extracts the same entries from a metal-cpp tree, fails if any stub entry is missing there
      or differs, and compares with (or, with --write, rewrites) FILE.

metal-cpp comes from the pymetal-cpp sdist on PyPI:
  pip download --no-deps --no-binary :all: pymetal-cpp -d /tmp/x   (thirdparty/metal-cpp/)
"""

import argparse
import pathlib
import re
import sys

STUB_MACRO = re.compile(r"\bMFA_STUB_\w+\([^)]*\)|\bNS_RETURNS_\w+")
IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


def skip_parens(text, at):
    """Index just past the balanced (...) group that starts at text[at]."""
    assert text[at] == "("
    depth = 0
    for i in range(at, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i + 1
    raise ValueError(f"unbalanced parentheses in: {text}")


def method_selector(declaration):
    """'- (T)a:(T)x b:(T)y;' -> 'a:b:'; '- (T)name ATTR;' -> 'name'."""
    text = declaration.strip()[1:].strip()
    at = skip_parens(text, text.index("("))
    selector = ""
    while True:
        text = text[at:].lstrip()
        name = IDENTIFIER.match(text)
        if not name:
            break
        rest = text[name.end() :].lstrip()
        if not rest.startswith(":"):
            if not selector:
                selector = name.group(0)  # unary selector; what follows is attributes
            break
        selector += name.group(0) + ":"
        rest = rest[1:].lstrip()
        at = skip_parens(rest, 0)
        text = rest
        parameter = IDENTIFIER.match(text[at:].lstrip())
        if not parameter:
            raise ValueError(f"cannot parse parameter name in: {declaration}")
        at = len(text) - len(text[at:].lstrip()) + parameter.end()
    if not selector:
        raise ValueError(f"cannot parse method: {declaration}")
    return selector


def property_selectors(declaration):
    """'@property (readonly) T name;' -> ['name']; readwrite adds 'setName:'."""
    attributes = re.match(r"\s*@property\s*\(([^)]*)\)", declaration)
    flags = [flag.strip() for flag in attributes.group(1).split(",")] if attributes else []
    body = STUB_MACRO.sub("", declaration.split(";")[0])
    name = IDENTIFIER.findall(body)[-1]
    getter = next((flag.split("=")[1].strip() for flag in flags if flag.startswith("getter")), name)
    selectors = [getter]
    if "readonly" not in flags:
        selectors.append("set" + name[0].upper() + name[1:] + ":")
    return selectors


def stub_entries(stub_dir):
    """{(kind, name): value} declared by the stub headers (None for selectors and functions)."""
    entries = {}
    for header in sorted(pathlib.Path(stub_dir).rglob("*.h")):
        for line in header.read_text().splitlines():
            stripped = line.strip()
            if stripped.startswith(("-", "+")) and stripped.endswith(";"):
                entries[("selector", method_selector(stripped))] = None
            elif stripped.startswith("@property"):
                for selector in property_selectors(stripped):
                    entries[("selector", selector)] = None
            elif stripped.startswith("extern") and "(void)" in stripped:
                entries[("function", re.search(r"\b(MTL\w+)\(void\)", stripped).group(1))] = None
            else:
                for name, expression in re.findall(
                    r"\b((?:MTL|NS)\w+)\s*(?:MFA_STUB_\w+\([^)]*\)\s*)?=\s*([^,;}]+)", stripped
                ):
                    if not re.fullmatch(r"[\d\s()<+]+", expression):
                        raise ValueError(f"{header}: cannot evaluate {name} = {expression}")
                    entries[("enum", name)] = str(eval(expression))  # digits, <<, + only
    return entries


def metal_cpp_entries(metal_cpp_dir):
    """{(kind, name): value} for the whole of metal-cpp, with ObjC names (MTL/NS prefixes)."""
    root = pathlib.Path(metal_cpp_dir)
    entries = {}
    for framework, prefix in (("Metal", "MTL"), ("Foundation", "NS")):
        for header in sorted((root / framework).glob("*.hpp")):
            text = header.read_text()
            for selector in re.findall(
                r"_(?:MTL|NS)_PRIVATE_DEF_SEL\(\s*\w+\s*,\s*\"([^\"]+)\"", text
            ):
                entries[("selector", selector)] = None
            for name, value in re.findall(r"^\s*(\w+)\s*=\s*(-?\d+)\s*,?\s*$", text, re.MULTILINE):
                entries[("enum", prefix + name)] = str(int(value))
            for name in re.findall(r"extern \"C\"[^;(]*?\b(MTL\w+)\(", text):
                entries[("function", name)] = None
    version = re.search(
        r"METALCPP_VERSION_MAJOR (\d+)\s+#define METALCPP_VERSION_MINOR (\d+)\s+"
        r"#define METALCPP_VERSION_PATCH (\d+)",
        (root / "Metal" / "MTLVersion.hpp").read_text(),
    )
    return entries, ".".join(version.groups()) if version else "unknown"


def format_subset(entries, version):
    lines = [
        "# The Foundation and Metal API that native/src/metal/typecheck/sdk declares, exactly as",
        f"# Apple's metal-cpp {version} publishes it (selectors, enum values, C functions).",
        "# Generated by tests/metal_host/check_selectors.py --metal-cpp DIR --write; do not edit.",
    ]
    for (kind, name), value in sorted(entries.items()):
        lines.append(f"{kind} {name}" + (f" {value}" if value is not None else ""))
    return "\n".join(lines) + "\n"


def parse_subset(path):
    entries = {}
    for line in pathlib.Path(path).read_text().splitlines():
        if line and not line.startswith("#"):
            kind, name, *value = line.split()
            entries[(kind, name)] = value[0] if value else None
    return entries


def compare(stubs, reference, reference_name):
    problems = []
    for key, value in sorted(stubs.items()):
        if key not in reference:
            problems.append(
                f"{key[0]} {key[1]}: declared by the stubs, absent from {reference_name}"
            )
        elif reference[key] != value:
            problems.append(
                f"{key[0]} {key[1]}: stubs say {value}, {reference_name} says {reference[key]}"
            )
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stubs", required=True, help="the stub SDK directory")
    parser.add_argument("--subset", required=True, help="metal_cpp_subset.txt")
    parser.add_argument("--metal-cpp", help="a metal-cpp tree (with Metal/ and Foundation/)")
    parser.add_argument("--write", action="store_true", help="rewrite --subset from --metal-cpp")
    args = parser.parse_args()

    stubs = stub_entries(args.stubs)
    problems = []
    if args.metal_cpp:
        published, version = metal_cpp_entries(args.metal_cpp)
        problems += compare(stubs, published, f"metal-cpp {version}")
        if not problems:
            expected = format_subset({key: published[key] for key in stubs}, version)
            if args.write:
                pathlib.Path(args.subset).write_text(expected)
            elif pathlib.Path(args.subset).read_text() != expected:
                problems.append(f"{args.subset} is out of date: rerun with --write")
    else:
        subset = parse_subset(args.subset)
        problems += compare(stubs, subset, args.subset)
        problems += [
            f"{kind} {name}: listed in {args.subset} but no longer declared by the stubs"
            for kind, name in sorted(set(subset) - set(stubs))
        ]
    for problem in problems:
        print(problem, file=sys.stderr)
    print(f"{len(stubs)} stub entries checked, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
