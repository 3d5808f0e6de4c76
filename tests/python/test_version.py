"""One version number: the MFA_VERSION_* macros of mfa.h. The library compiles them in, CMake's
project() reads them (cmake/mfa_version.cmake) and so does the Python package's metadata
(pyproject.toml's dynamic-metadata regex); each of those must agree with the header."""

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import mfa_native
import pytest
from mfa_native import _library

_SOURCE_TREE = Path(__file__).resolve().parents[2]
_PYPROJECT = _SOURCE_TREE / "pyproject.toml"
_CMAKE_SCRIPT = _SOURCE_TREE / "cmake" / "mfa_version.cmake"
_HEADER = _SOURCE_TREE / "native" / "include" / "mfa.h"
# Wheel tests (cibuildwheel) run from a copy of tests/python and pyproject.toml only.
_in_source_tree = pytest.mark.skipif(
    not (_PYPROJECT.is_file() and _CMAKE_SCRIPT.is_file() and _HEADER.is_file()),
    reason="not run from a source tree",
)


def _header_version(text):
    parts = [
        re.search(rf"^#define MFA_VERSION_{part} ([0-9]+)$", text, re.MULTILINE)
        for part in ("MAJOR", "MINOR", "PATCH")
    ]
    assert all(parts), "mfa.h lacks one of MFA_VERSION_MAJOR, _MINOR, _PATCH"
    return ".".join(match.group(1) for match in parts)


@pytest.fixture(scope="module")
def header_version():
    return _header_version(_library.header_path.read_text(encoding="utf-8"))


def test_library_version_is_the_headers(header_version):
    assert mfa_native.__version__ == header_version
    major, minor, patch = map(int, header_version.split("."))
    assert _library.lib.mfa_version_number() == major * 10000 + minor * 100 + patch


@pytest.mark.skipif("MFA_LIBRARY" in os.environ, reason="the library is not the installed one")
def test_distribution_version_is_the_headers(header_version):
    assert importlib.metadata.version("mfa-native") == header_version


@_in_source_tree
@pytest.mark.skipif(sys.version_info < (3, 11), reason="reads pyproject.toml with tomllib")
def test_metadata_regex_reads_the_header():
    import tomllib

    settings = tomllib.loads(_PYPROJECT.read_text(encoding="utf-8"))
    (entry,) = [
        entry for entry in settings["tool"]["dynamic-metadata"] if entry["field"] == "version"
    ]
    header = (_SOURCE_TREE / entry["input"]).read_text(encoding="utf-8")
    # As scikit-build-core's regex provider applies it.
    match = re.search(entry["regex"], header, re.MULTILINE)
    assert match, f"{entry['regex']!r} does not match {entry['input']}"
    assert entry["result"].format(**match.groupdict()) == _header_version(header)


@_in_source_tree
@pytest.mark.skipif(not shutil.which("cmake"), reason="needs cmake")
def test_cmake_reads_the_header():
    result = subprocess.run(["cmake", "-P", str(_CMAKE_SCRIPT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == _header_version(_HEADER.read_text(encoding="utf-8"))
