"""Finding libmfa and its header, and binding them with cffi in ABI mode.

The declarations handed to cffi are read from ``mfa.h`` itself at import, so there is no second
copy of the C API to keep in sync; tests/python/test_cdef_drift.py compiles a check of every
prototype, struct layout and constant against the header to prove the two agree.
"""

from __future__ import annotations

import os
import re
import sys
from contextlib import ExitStack
from importlib import resources
from pathlib import Path
from typing import Any

import cffi

__all__ = ["ffi", "lib", "library_path", "header_path", "cdef_from_header"]

if sys.platform == "darwin":
    _LIBRARY_NAME = "libmfa.dylib"
elif sys.platform == "win32":
    _LIBRARY_NAME = "mfa.dll"
else:
    _LIBRARY_NAME = "libmfa.so"

_CONDITIONAL_START = re.compile(r"#\s*(if|ifdef|ifndef)\b(.*)")
_CONDITIONAL_END = re.compile(r"#\s*endif\b")
_INTEGER_DEFINE = re.compile(r"#\s*define\s+(\w+)\s+((?:0[xX][0-9a-fA-F]+)|(?:[0-9]+))\s*$")
_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.DOTALL)


def cdef_from_header(text: str) -> str:
    """Turn the text of mfa.h into declarations that ``cffi.FFI.cdef`` accepts.

    Comments are removed, ``#define NAME <integer literal>`` lines are kept (cffi exposes them
    as ``lib.NAME``), every other preprocessor line is dropped, and so is everything inside
    ``#ifdef __cplusplus`` blocks (the ``extern "C" {`` wrapper). The header promises to stay
    this simple; a construct this function cannot represent raises ValueError rather than
    being dropped unnoticed.
    """
    text = _COMMENT.sub(" ", text)
    kept: list[str] = []
    # One entry per open conditional: True when it is a __cplusplus block whose body is dropped.
    open_blocks: list[bool] = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped.endswith("\\"):
            raise ValueError(f"mfa.h line {number}: line continuations are not supported")
        in_cplusplus = any(open_blocks)
        if stripped.startswith("#"):
            start = _CONDITIONAL_START.match(stripped)
            if start:
                open_blocks.append("__cplusplus" in start.group(2))
                continue
            if _CONDITIONAL_END.match(stripped):
                if not open_blocks:
                    raise ValueError(f"mfa.h line {number}: #endif without #if")
                open_blocks.pop()
                continue
            if re.match(r"#\s*(else|elif)\b", stripped):
                raise ValueError(f"mfa.h line {number}: #else/#elif are not supported")
            define = _INTEGER_DEFINE.match(stripped)
            if define and not in_cplusplus:
                kept.append(f"#define {define.group(1)} {define.group(2)}")
            elif re.match(r"#\s*define\s+\w+\s+\S", stripped):
                raise ValueError(
                    f"mfa.h line {number}: only integer-literal #defines can be bound: {stripped!r}"
                )
            continue
        if not in_cplusplus and stripped:
            kept.append(line)
    if open_blocks:
        raise ValueError("mfa.h: unterminated #if block")
    return "\n".join(kept) + "\n"


def _repository_header() -> Path | None:
    """The header of the source tree this package sits in (python/mfa_native -> native/include)."""
    candidate = Path(__file__).resolve().parents[2] / "native" / "include" / "mfa.h"
    return candidate if candidate.is_file() else None


def _locate(resource_stack: ExitStack) -> tuple[Path, Path]:
    """Return (library path, header path), following MFA_LIBRARY / MFA_HEADER when set."""
    override = os.environ.get("MFA_LIBRARY")
    if override:
        library = Path(override)
        if not library.is_file():
            raise ImportError(f"MFA_LIBRARY={override!r} is not a file")
        header_override = os.environ.get("MFA_HEADER")
        if header_override:
            header = Path(header_override)
            if not header.is_file():
                raise ImportError(f"MFA_HEADER={header_override!r} is not a file")
            return library, header
        repository_header = _repository_header()
        if repository_header is None:
            raise ImportError(
                "MFA_LIBRARY is set but this mfa_native is not inside the mfa source tree; "
                "set MFA_HEADER to the mfa.h that library was built from"
            )
        return library, repository_header

    package = resources.files(__package__)
    library_resource = package / _LIBRARY_NAME
    header_resource = package / "include" / "mfa.h"
    if not library_resource.is_file() or not header_resource.is_file():
        raise ImportError(
            f"mfa_native has no bundled {_LIBRARY_NAME}: install the package with "
            "'pip install .' from the repository root, or point MFA_LIBRARY at a libmfa built "
            "with CMake"
        )
    # as_file gives real paths even for zipped installs; the stack keeps them alive.
    library = resource_stack.enter_context(resources.as_file(library_resource))
    header = resource_stack.enter_context(resources.as_file(header_resource))
    return Path(library), Path(header)


def _load() -> tuple[cffi.FFI, Any, Path, Path, ExitStack]:
    resource_stack = ExitStack()
    library, header = _locate(resource_stack)
    ffi = cffi.FFI()
    ffi.cdef(cdef_from_header(header.read_text(encoding="utf-8")))
    try:
        lib: Any = ffi.dlopen(str(library))
    except OSError as error:
        raise ImportError(f"cannot load {library}: {error}") from error
    built_with = lib.mfa_version_number()
    if built_with != lib.MFA_VERSION_NUMBER:
        raise ImportError(
            f"{library} is libmfa version number {built_with} but the header {header} is "
            f"{lib.MFA_VERSION_NUMBER}: the library and header do not belong together"
        )
    return ffi, lib, library, header, resource_stack


# lib's attributes are the functions and constants of mfa.h, known only once the header is read.
ffi, lib, library_path, header_path, _resource_stack = _load()
