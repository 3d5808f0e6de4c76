"""The declarations cffi uses must be exactly the C compiler's view of mfa.h.

cffi's ABI mode checks nothing: a prototype or struct that drifted from the library would read
and write the wrong bytes. So every function pointer type, struct size, field offset, enum value
and #define that cffi derived from the header is turned into C that a compiler checks against the
same header, and the tests below show that one changed declaration makes that check fail.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import cffi
import pycparser
import pytest
from _errors import raises
from mfa_native import _library
from pycparser import c_ast, c_generator

# Standard typedefs the header uses; pycparser only needs to know they name types.
_STANDARD_TYPEDEFS = ("size_t", "ptrdiff_t", "intptr_t", "uintptr_t") + tuple(
    f"{sign}int{bits}_t" for sign in ("", "u") for bits in (8, 16, 32, 64)
)
_REPOSITORY_HEADER = Path(__file__).resolve().parents[2] / "native" / "include" / "mfa.h"


def _compiler():
    for candidate in (os.environ.get("CC"), "cc", "clang", "gcc"):
        if candidate and shutil.which(candidate):
            return candidate
    pytest.fail("no C compiler found (set CC): the drift check must compile")


def _function_declarations(cdef):
    """pycparser Decl nodes of every function prototype in the cdef text."""
    declarations = "\n".join(line for line in cdef.splitlines() if not line.startswith("#"))
    prelude = "".join(f"typedef int {name};\n" for name in _STANDARD_TYPEDEFS)
    tree = pycparser.CParser().parse(prelude + declarations, "cdef")
    return [
        node
        for node in tree.ext
        if isinstance(node, c_ast.Decl) and isinstance(node.type, c_ast.FuncDecl)
    ]


def _pointer_check(declaration):
    """'static RET (*const chk_NAME)(ARGS) = &NAME;': a compile error unless NAME has exactly
    that type (return type, every parameter type, constness and arity)."""
    function_type = declaration.type
    innermost = function_type.type
    while not isinstance(innermost, c_ast.TypeDecl):
        innermost = innermost.type
    name = declaration.name
    innermost.declname = f"chk_{name}"
    pointer = c_ast.Decl(
        f"chk_{name}",
        [],
        [],
        ["static"],
        [],
        c_ast.PtrDecl(["const"], function_type),
        c_ast.UnaryOp("&", c_ast.ID(name)),
        None,
    )
    return "__attribute__((unused)) " + c_generator.CGenerator().visit(pointer) + ";"


def _check_source(cdef):
    """C source that compiles against mfa.h only if the cdef's declarations match it."""
    ffi = cffi.FFI()
    ffi.cdef(cdef)
    constants = ffi.dlopen(None)  # integer #defines and enum values need no symbols
    lines = ["#include <stddef.h>", '#include "mfa.h"', ""]
    lines += [_pointer_check(declaration) for declaration in _function_declarations(cdef)]

    typedef_names, struct_names, _ = ffi.list_types()
    for struct in struct_names:
        c_type = ffi.typeof(f"struct {struct}")
        if c_type.fields is None:
            continue  # opaque, such as mfa_context
        lines.append(
            f"_Static_assert(sizeof(struct {struct}) == {ffi.sizeof(c_type)} && "
            f"_Alignof(struct {struct}) == {ffi.alignof(c_type)}, "
            f'"size of struct {struct}");'
        )
        for field, _ in c_type.fields:
            lines.append(
                f"_Static_assert(offsetof(struct {struct}, {field}) == "
                f'{ffi.offsetof(c_type, field)}, "offset of {struct}.{field}");'
            )
    for typedef in typedef_names:
        c_type = ffi.typeof(typedef)
        if c_type.kind == "enum":
            lines.append(
                f'_Static_assert(sizeof({typedef}) == {ffi.sizeof(c_type)}, "size of {typedef}");'
            )
            lines += [
                f'_Static_assert({name} == {value}, "value of {name}");'
                for name, value in c_type.relements.items()
            ]
    for name in re.findall(r"^#define (\w+) ", cdef, re.MULTILINE):
        lines.append(f'_Static_assert({name} == {getattr(constants, name)}, "value of {name}");')
    return "\n".join(lines) + "\n"


def _compile(source, tmp_path):
    path = tmp_path / "cdef_check.c"
    path.write_text(source)
    return subprocess.run(
        [
            _compiler(),
            "-std=c11",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-fsyntax-only",
            f"-I{_library.header_path.parent}",
            str(path),
        ],
        capture_output=True,
        text=True,
    )


@pytest.fixture(scope="module")
def cdef():
    return _library.cdef_from_header(_library.header_path.read_text(encoding="utf-8"))


def test_every_declaration_matches_the_compiled_header(cdef, tmp_path):
    source = _check_source(cdef)
    # Guard against a check that silently checks nothing.
    assert source.count("= &mfa_") == len(_function_declarations(cdef)) >= 20
    assert "offsetof(struct mfa_tensor, strides)" in source
    assert "MFA_ERROR_INVALID_ARGUMENT == 1" in source
    result = _compile(source, tmp_path)
    assert result.returncode == 0, result.stderr + "\n" + source


# Each mutation changes one declaration the way a stale copy of the header would.
_MUTATIONS = {
    "parameter width": (r"void\* mfa_alloc\(size_t bytes\)", "void* mfa_alloc(uint32_t bytes)"),
    "dropped const": (
        r"mfa_context_backend\(const mfa_context\* ctx\)",
        "mfa_context_backend(mfa_context* ctx)",
    ),
    "return type": (r"unsigned mfa_version_number\(void\)", "int mfa_version_number(void)"),
    "arity": (r"void mfa_free\(void\* ptr\)", "void mfa_free(void* ptr, size_t bytes)"),
    "struct field width": (r"int32_t causal;", "int64_t causal;"),
    "enum value": (r"MFA_ERROR_UNSUPPORTED = 2", "MFA_ERROR_UNSUPPORTED = 5"),
    "define value": (r"#define MFA_VERSION_MAJOR \d+", "#define MFA_VERSION_MAJOR 99"),
}


@pytest.mark.parametrize("mutation", sorted(_MUTATIONS))
def test_a_drifted_declaration_fails_the_check(cdef, tmp_path, mutation):
    pattern, replacement = _MUTATIONS[mutation]
    drifted, count = re.subn(pattern, replacement, cdef)
    assert count == 1, f"mutation {mutation!r} no longer applies to mfa.h; update it"
    result = _compile(_check_source(drifted), tmp_path)
    assert result.returncode != 0, f"the check missed a {mutation} change"


def test_every_declared_function_is_exported(cdef):
    names = [declaration.name for declaration in _function_declarations(cdef)]
    missing = [name for name in names if not hasattr(_library.lib, name)]
    assert not missing, f"declared in mfa.h but not exported by {_library.library_path}"


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or not shutil.which("nm"),
    reason="reads the ELF dynamic symbol table with nm",
)
def test_every_exported_function_is_declared(cdef):
    listing = subprocess.run(
        ["nm", "-D", "--defined-only", str(_library.library_path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    exported = {
        fields[-1]
        for fields in map(str.split, listing.splitlines())
        if len(fields) == 3 and fields[1] in "TW" and fields[2].startswith("mfa_")
    }
    declared = {declaration.name for declaration in _function_declarations(cdef)}
    assert exported, "nm found no mfa_ functions: the listing was not understood"
    assert exported == declared


@pytest.mark.skipif(not _REPOSITORY_HEADER.is_file(), reason="not run from a source tree")
def test_installed_header_is_the_repository_header():
    assert _library.header_path.read_bytes() == _REPOSITORY_HEADER.read_bytes(), (
        f"{_library.header_path} differs from {_REPOSITORY_HEADER}: reinstall mfa_native"
    )


def test_header_parsing_rejects_what_it_cannot_bind():
    with raises(ValueError, "mfa.h line 1: only integer-literal #defines can be bound"):
        _library.cdef_from_header("#define MFA_FLAG (1u << 3)\n")
    with raises(ValueError, "mfa.h line 2: #else/#elif are not supported"):
        _library.cdef_from_header("#ifdef X\n#else\n#endif\n")
    kept = _library.cdef_from_header(
        '#ifndef G\n#define G\n#define MFA_A 0x10 /* note */\n#ifdef __cplusplus\nextern "C" {\n'
        "#endif\nint f(void);\n#ifdef __cplusplus\n}\n#endif\n#endif\n"
    )
    assert kept.split("\n") == ["#define MFA_A 0x10", "int f(void);", ""]


def test_packed_arrays_are_the_structs_cffi_fills():
    # The Python layer packs each mfa_array with struct rather than through cffi's conversion:
    # both must write the same bytes, for host memory and for a device buffer at an offset.
    from mfa_native import _attention

    ffi = _library.ffi
    rows = [
        (0x7F0012345678, 0, 0, _library.lib.MFA_DTYPE_BF16, (2, 8, 129, 64), (66048, 64, 512, 1)),
        (0, 0xDEADBEEF0, 4096, _library.lib.MFA_DTYPE_I32, (1, 1, 1, 3), (0, 0, 0, -1)),
    ]
    packed = b"".join(
        _attention._ARRAY.pack(data, buffer, offset, dtype, *shape, *strides)
        for data, buffer, offset, dtype, shape, strides in rows
    )
    filled = ffi.new(
        "mfa_array[]",
        [
            (ffi.cast("void*", data), ffi.cast("void*", buffer), offset, dtype, shape, strides)
            for data, buffer, offset, dtype, shape, strides in rows
        ],
    )
    assert packed == bytes(ffi.buffer(filled))
