#!/usr/bin/env python3
"""Turns a preprocessed .metal file into C++ for the simulator, plus its binding glue.

Input: the output of the C++ preprocessor run over a .metal file with the simulator's
compatibility headers (MetalSimKernels.cmake), in which Metal's address-space keywords and
`kernel` are marker identifiers. Output: the same text with

  - the markers removed, and the [[...]] attribute lists that bind kernel parameters and
    function constants blanked out (C++ would ignore or reject them), every line kept where it
    was so diagnostics point at the .metal source;
  - program-scope function constants `constant T name [[function_constant(i)]];` and constants
    derived from them (`constant T name = expression;`) turned into thread-local variables with
    a per-dispatch setter, so that concurrent dispatches with different constants do not
    interfere;
  - appended glue: for every kernel, an entry point that binds each parameter from its
    attribute ([[buffer(i)]], [[threadgroup(i)]], built-ins), and the setter of the file's
    function constants; --manifest lists the file's kernels.

With --kernel-table it writes the table of a binary's kernels from their files' manifests: the
one place the executor finds kernels (mfa_sim_abi::kernels).

It accepts the kernel forms the project's kernels use, which sim.h lists; any other construct
with a Metal meaning is reported as `file:line: error: ...` naming it, and fails the build:
template kernels, [[host_name]], the [[kernel]] spelling, kernels or function constants in a
namespace or class, kernel declarations without a body, threadgroup variables declared in a
function body, Metal attributes the simulator does not model, binding attributes outside a
kernel's parameters, parameters without a binding, and size_t or ptrdiff_t arguments.
"""

import argparse
import json
import os
import re
import sys

# clang address spaces for the type-checking pass (--address-spaces); `thread` is the generic
# (default) one, as in MSL where an unqualified pointer points to thread memory.
ADDRESS_SPACES = {
    "__mfa_sim_device__": 1,
    "__mfa_sim_constant__": 2,
    "__mfa_sim_threadgroup__": 3,
}

MARKERS = {
    "__mfa_sim_device__",
    "__mfa_sim_constant__",
    "__mfa_sim_threadgroup__",
    "__mfa_sim_thread__",
    "__mfa_sim_kernel__",
}

# The built-ins a kernel parameter can take, each named as its mfa_sim_abi::ThreadInfo field.
BUILTINS = {
    "thread_position_in_grid",
    "thread_position_in_threadgroup",
    "threadgroup_position_in_grid",
    "threads_per_threadgroup",
    "threadgroups_per_grid",
    "threads_per_grid",
    "thread_index_in_threadgroup",
    "thread_index_in_simdgroup",
    "simdgroup_index_in_threadgroup",
    "simdgroups_per_threadgroup",
    "threads_per_simdgroup",
}

# Attributes that bind a kernel parameter or a function constant: consumed here.
BINDING_ATTRIBUTES = BUILTINS | {"buffer", "__mfa_sim_threadgroup__", "function_constant"}

# Attributes with a Metal meaning the simulator does not model: an error wherever they appear,
# rather than a C++ compiler silently ignoring them.
UNSUPPORTED_ATTRIBUTES = {
    "host_name",
    "max_total_threads_per_threadgroup",
    "texture",
    "sampler",
    "stage_in",
    "visible",
    "user",
    "dispatch_threads_per_threadgroup",
    "dispatch_simdgroups_per_threadgroup",
    "thread_execution_width",
    "quadgroup_index_in_threadgroup",
    "thread_index_in_quadgroup",
}

TOKEN_RE = re.compile(
    r"""
    (?P<directive>^[ \t]*\#[^\n]*)
  | (?P<space>[ \t\r\f\v]+|\n)
  | (?P<comment>//[^\n]*|/\*.*?\*/)
  | (?P<string>(?:u8|u|U|L)?"(?:[^"\\\n]|\\.)*")
  | (?P<char>(?:u8|u|U|L)?'(?:[^'\\\n]|\\.)*')
  | (?P<number>\.?[0-9](?:[eEpP][+-]|[0-9A-Za-z_.'])*)
  | (?P<identifier>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<punct>::|->|\.\.\.|[-+*/%&|^!=<>]=|&&|\|\||\+\+|--|.)
""",
    re.VERBOSE | re.MULTILINE | re.DOTALL,
)

LINE_MARKER_RE = re.compile(r'^[ \t]*#\s*(?:line\s+)?(\d+)\s+"((?:[^"\\]|\\.)*)"')


class CodegenError(Exception):
    pass


class Token:
    __slots__ = ("kind", "text", "start", "end", "file", "line")

    def __init__(self, kind, text, start, end, file, line):
        self.kind, self.text, self.start, self.end = kind, text, start, end
        self.file, self.line = file, line

    def where(self):
        return f"{self.file}:{self.line}"


def tokenize(text):
    tokens = []
    file, line = "<input>", 1
    for m in TOKEN_RE.finditer(text):
        kind = m.lastgroup
        value = m.group()
        if kind == "directive":
            marker = LINE_MARKER_RE.match(value)
            if marker:
                # The marker names the line that follows it; the newline after it adds one.
                line = int(marker.group(1)) - 1
                file = marker.group(2).encode().decode("unicode_escape")
            continue
        if kind in ("space", "comment"):
            line += value.count("\n")
            continue
        tokens.append(Token(kind, value, m.start(), m.end(), file, line))
        line += value.count("\n")
    return tokens


def c_string(text):
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class Attribute:
    def __init__(self, name, args, token):
        self.name, self.args, self.token = name, args, token


class AttributeList:
    def __init__(self, first, last, attributes):
        self.first, self.last, self.attributes = first, last, attributes  # token indices

    def find(self, name):
        for a in self.attributes:
            if a.name == name:
                return a
        return None

    def binding(self):
        """The first attribute that binds something (a kernel parameter or a function
        constant), or None."""
        return next((a for a in self.attributes if a.name in BINDING_ATTRIBUTES), None)


class Parameter:
    def __init__(self, name, tokens, attributes, is_reference, is_pointer):
        self.name, self.tokens, self.attributes = name, tokens, attributes
        self.is_reference, self.is_pointer = is_reference, is_pointer


class Codegen:
    def __init__(self, text, source, address_spaces, folded_constants=None, only_kernel=None):
        self.text = text
        self.source = source
        self.address_spaces = address_spaces
        # index -> value: function constants compiled in as constexpr values, as Metal's
        # pipeline creation specialises them (for metal_sim_check_residency.py); None: bound
        # per dispatch.
        self.folded_constants = folded_constants
        self.only_kernel = only_kernel
        self.tokens = tokenize(text)
        self.edits = []  # (start, end, replacement)
        self.attribute_lists = {}  # first token index -> AttributeList
        self.parameter_attributes = set()  # first token indices of kernel parameters' lists
        self.kernels = {}  # name -> parameters
        self.constants = []  # names of function constants and constants derived from them
        self.run()

    # ---- helpers ----

    def error(self, token, message):
        raise CodegenError(f"{token.where()}: error: {message}")

    def space_attribute(self, marker):
        return f"__attribute__((address_space({ADDRESS_SPACES[marker]})))"

    def rewrite_marker(self, i):
        """Removes a marker; in the type-checking pass, an address-space marker that qualifies
        a pointer becomes clang's address_space attribute. References, objects and pointers to
        bfloat stay in the generic space: C++ has no generic `this`, so a class object in a named
        address space can be neither copied nor converted, unlike in MSL, and bfloat is a class
        here."""
        marker = self.tokens[i].text
        if self.address_spaces and marker in ADDRESS_SPACES and self.qualifies_pointer(i):
            self.replace(i, i, self.space_attribute(marker))
        else:
            self.blank(i, i)

    def qualifies_pointer(self, i):
        for t in self.tokens[i + 1 :]:
            if t.text == "*":
                return True
            if t.text.startswith("bfloat"):
                return False
            if t.text in (";", ",", ")", "=", "(", "[", "{", "&", "&&", ">"):
                return False
        return False

    def blank(self, first, last):
        """Replaces tokens first..last (inclusive) by spaces, keeping newlines."""
        start, end = self.tokens[first].start, self.tokens[last].end
        self.edits.append((start, end, re.sub(r"[^\n]", " ", self.text[start:end])))

    def replace(self, first, last, replacement):
        start, end = self.tokens[first].start, self.tokens[last].end
        newlines = self.text.count("\n", start, end)
        self.edits.append((start, end, replacement + "\n" * newlines))

    def matching(self, index, open_text, close_text):
        depth = 0
        for i in range(index, len(self.tokens)):
            t = self.tokens[i].text
            if t == open_text:
                depth += 1
            elif t == close_text:
                depth -= 1
                if depth == 0:
                    return i
        self.error(self.tokens[index], f"unbalanced '{open_text}'")

    def is_attribute_start(self, i):
        return (
            i + 1 < len(self.tokens)
            and self.tokens[i].text == "["
            and self.tokens[i + 1].text == "["
            and self.tokens[i].end == self.tokens[i + 1].start
        )

    def attribute_list(self, i):
        """The [[...]] list starting at token i, parsed once."""
        if i not in self.attribute_lists:
            self.attribute_lists[i] = self.parse_attribute_list(i)
        return self.attribute_lists[i]

    def parse_attribute_list(self, i):
        """[[a, b(c), ns::d]] starting at token i; returns the AttributeList."""
        depth = 0
        j = i
        while True:
            t = self.tokens[j].text
            if t in "[(":
                depth += 1
            elif t in "])":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        attributes = []
        k = i + 2
        while k < j - 1:
            if self.tokens[k].text == ",":
                k += 1
                continue
            name_token = self.tokens[k]
            name = name_token.text
            k += 1
            while k < j - 1 and self.tokens[k].text == "::":
                name += "::" + self.tokens[k + 1].text
                k += 2
            args = None
            if k < j - 1 and self.tokens[k].text == "(":
                close = self.matching(k, "(", ")")
                args = self.tokens[k + 1 : close]
                k = close + 1
            attributes.append(Attribute(name, args, name_token))
        return AttributeList(i, j, attributes)

    # ---- the pass over the file ----

    def run(self):
        tokens = self.tokens
        scopes = []  # "namespace" | "extern" | "class" | "block", innermost last
        statement_start = 0
        i = 0
        while i < len(tokens):
            tok = tokens[i]
            if self.is_attribute_start(i):
                attrs = self.attribute_list(i)
                self.check_attributes(attrs)
                if attrs.binding():
                    self.blank(attrs.first, attrs.last)
                i = attrs.last + 1
                continue
            if tok.kind == "identifier" and tok.text in MARKERS:
                in_function = "block" in scopes or "class" in scopes
                if tok.text == "__mfa_sim_constant__" and i == statement_start and not in_function:
                    i = self.on_program_scope_constant(i, scopes)
                    statement_start = i
                    continue
                if (
                    tok.text == "__mfa_sim_threadgroup__"
                    and i == statement_start
                    and "block" in scopes
                    and self.is_variable_declaration(i)
                ):
                    self.error(
                        tok,
                        "threadgroup variables declared in a function body are not supported by "
                        "metal-sim: pass the memory as a `threadgroup T* name [[threadgroup(i)]]` "
                        "kernel parameter",
                    )
                if tok.text == "__mfa_sim_kernel__":
                    self.on_kernel(i, statement_start, scopes)
                else:
                    self.rewrite_marker(i)
                i += 1
                continue
            if tok.text == "{":
                scopes.append(self.classify_brace(statement_start, i))
                statement_start = i + 1
            elif tok.text == "}":
                if scopes:
                    scopes.pop()
                statement_start = i + 1
            elif tok.text == ";":
                statement_start = i + 1
            i += 1

    def check_attributes(self, attrs):
        for a in attrs.attributes:
            if a.name == "__mfa_sim_kernel__":
                self.error(
                    a.token,
                    "the [[kernel]] attribute is not supported by metal-sim: write "
                    "`kernel void name(...)`",
                )
            if a.name in UNSUPPORTED_ATTRIBUTES:
                self.error(a.token, f"[[{a.name}]] is not supported by metal-sim")
        binding = attrs.binding()
        if binding and attrs.first not in self.parameter_attributes:
            if binding.name == "function_constant":
                self.error(
                    binding.token,
                    "[[function_constant]] is supported on a kernel's optional buffers and in "
                    "`constant T name [[function_constant(i)]];` at global scope",
                )
            self.error(
                binding.token,
                f"[[{binding.name.replace('__mfa_sim_threadgroup__', 'threadgroup')}]] outside "
                "a kernel's parameters",
            )

    def classify_brace(self, first, brace):
        words = [t.text for t in self.tokens[first:brace]]
        if "namespace" in words:
            return "namespace"
        if words[:1] == ["extern"] and len(words) == 2 and words[1].startswith('"'):
            return "extern"
        if (
            any(w in ("struct", "class", "union", "enum") for w in words)
            and "(" not in words
            and "=" not in words
        ):
            return "class"
        return "block"

    def is_variable_declaration(self, i):
        """Whether the statement at marker i declares storage (not a pointer or reference)."""
        j = i + 1
        while j < len(self.tokens) and self.tokens[j].text not in (";", "=", "(", ")", ","):
            if self.tokens[j].text in ("*", "&"):
                return False
            j += 1
        return j < len(self.tokens) and self.tokens[j].text == ";"

    # ---- program-scope constants ----

    def on_program_scope_constant(self, i, scopes):
        """constant T name [[function_constant(n)]]; or constant T name = expression;"""
        end = i
        while self.tokens[end].text != ";":
            if self.is_attribute_start(end):
                end = self.attribute_list(end).last
            end += 1
        body = list(range(i + 1, end))
        attrs = next((self.attribute_list(k) for k in body if self.is_attribute_start(k)), None)
        if attrs and attrs.find("function_constant"):
            name_token = self.tokens[attrs.first - 1]
            self.require_global(name_token, scopes)
            type_text = " ".join(t.text for t in self.tokens[i + 1 : attrs.first - 1])
            index_text = " ".join(t.text for t in attrs.find("function_constant").args)
            if self.folded_constants is not None:
                self.fold_constant(i, end, name_token, type_text, index_text)
                return end + 1
            self.declare_constant(
                i,
                end,
                name_token.text,
                type_text,
                f"return ::mfa_sim_glue::bind_constant({name_token.text}, "
                f"__mfa_sim_fc_defined_{name_token.text}, table, {index_text}, "
                + c_string(
                    f"function constant '{name_token.text}' "
                    f"[[function_constant({index_text})]]: the "
                    f"dispatch's value is not of the declared type "
                    f"'{type_text}'"
                )
                + ");",
            )
            return end + 1
        equals = next((k for k in body if self.tokens[k].text == "="), None)
        if equals is not None and not attrs:
            expression = self.tokens[equals + 1 : end]
            used = {t.text for t in expression if t.kind == "identifier"}
            derived = used & set(self.constants) or any(
                name.startswith("__mfa_sim_fc_defined_") for name in used
            )
            if derived and not any(t.text == "," for t in self.tokens[i:equals]):
                name_token = self.tokens[equals - 1]
                self.require_global(name_token, scopes)
                type_text = " ".join(t.text for t in self.tokens[i + 1 : equals - 1])
                expression_text = " ".join(t.text for t in expression)
                if self.folded_constants is not None:
                    self.replace(
                        i,
                        end,
                        f"static constexpr {type_text} {name_token.text} = ({expression_text}); "
                        f"static constexpr bool __mfa_sim_fc_defined_{name_token.text} = true; "
                        f"static const char* __mfa_sim_bind_{name_token.text}("
                        f"const ::mfa_sim_abi::ConstantTable&) {{ return nullptr; }}",
                    )
                    self.constants.append(name_token.text)
                    return end + 1
                self.declare_constant(
                    i,
                    end,
                    name_token.text,
                    type_text,
                    f"(void)table; {name_token.text} = ({expression_text}); "
                    f"__mfa_sim_fc_defined_{name_token.text} = true; "
                    f"return nullptr;",
                )
                return end + 1
        self.rewrite_marker(i)
        return i + 1

    def fold_constant(self, first, last, name_token, type_text, index_text):
        if not re.fullmatch(r"[0-9+\-*() ]+", index_text):
            self.error(name_token, f"cannot fold [[function_constant({index_text})]]")
        index = str(eval(index_text))  # digits and arithmetic only, checked above
        value = self.folded_constants.get(index)
        name = name_token.text
        if isinstance(value, bool):
            value_text = "true" if value else "false"
        elif value is None:
            value_text = f"{type_text}()"
        else:
            value_text = str(value)
        self.replace(
            first,
            last,
            f"static constexpr {type_text} {name} = {value_text}; "
            f"static constexpr bool __mfa_sim_fc_defined_{name} = "
            f"{'false' if value is None else 'true'}; "
            f"static const char* __mfa_sim_bind_{name}("
            f"const ::mfa_sim_abi::ConstantTable&) {{ return nullptr; }}",
        )
        self.constants.append(name)

    def require_global(self, name_token, scopes):
        if scopes:
            self.error(
                name_token,
                f"function constant '{name_token.text}' is inside a {scopes[-1]}: metal-sim "
                "supports function constants at global scope",
            )

    def declare_constant(self, first, last, name, type_text, setter_body):
        self.replace(
            first,
            last,
            f"__thread {type_text} {name}; "
            f"__thread bool __mfa_sim_fc_defined_{name}; "
            f"static const char* __mfa_sim_bind_{name}("
            f"const ::mfa_sim_abi::ConstantTable& table) {{ {setter_body} }}",
        )
        self.constants.append(name)

    # ---- kernels ----

    def on_kernel(self, marker, statement_start, scopes):
        """kernel void NAME ( parameters ) { ... }"""
        before = self.tokens[statement_start:marker]
        j = marker + 1
        while j < len(self.tokens) and self.tokens[j].text != "(":
            if self.is_attribute_start(j):
                j = self.attribute_list(j).last
            j += 1
        name_token = self.tokens[j - 1]
        name = name_token.text
        template = next((t for t in before if t.text == "template"), None)
        if template:
            self.error(
                template,
                f"kernel '{name}': template kernels are not supported by metal-sim: write one "
                "`kernel void name(...)` per variant",
            )
        if scopes:
            self.error(
                name_token,
                f"kernel '{name}' is inside a {scopes[-1]}: metal-sim supports kernels at "
                "global scope",
            )
        close = self.matching(j, "(", ")")
        after = self.tokens[close + 1].text if close + 1 < len(self.tokens) else ""
        if after == ";":
            self.error(
                name_token,
                f"kernel '{name}' is declared without its definition: metal-sim binds kernels "
                "where they are defined, so declare each kernel once, with its body",
            )
        if after != "{":
            self.error(name_token, f"kernel '{name}': expected a function definition")
        if name in self.kernels:
            self.error(
                name_token,
                f"kernel '{name}' is defined twice (Metal does not overload kernels)",
            )
        self.kernels[name] = self.parse_parameters(j, close, name)
        if self.only_kernel is None or name == self.only_kernel:
            self.blank(marker, marker)
        else:
            # Compiled only if the kernel is: an unused static function is not.
            self.replace(marker, marker, "[[maybe_unused]] static")

    def parse_parameters(self, open_paren, close_paren, kernel):
        parameters = []
        current = []
        depth = 0
        for k in range(open_paren + 1, close_paren):
            t = self.tokens[k].text
            if t in ("(", "[", "{", "<"):
                depth += 1
            elif t in (")", "]", "}", ">"):
                depth -= 1
            if t == "," and depth == 0:
                parameters.append(current)
                current = []
            else:
                current.append(k)
        if current:
            parameters.append(current)
        result = []
        for indices in parameters:
            plain = []  # tokens outside attribute lists
            attrs = []
            k = 0
            while k < len(indices):
                index = indices[k]
                if self.is_attribute_start(index):
                    lst = self.attribute_list(index)
                    self.parameter_attributes.add(index)
                    attrs.append(lst)
                    while k < len(indices) and indices[k] <= lst.last:
                        k += 1
                    continue
                plain.append(self.tokens[index])
                k += 1
            if [t.text for t in plain] == ["void"]:
                continue
            names = [t for t in plain if t.kind == "identifier" and t.text not in MARKERS]
            if not names:
                self.error(self.tokens[indices[0]], f"kernel '{kernel}': unnamed parameter")
            for t in plain:
                if t.text in ("size_t", "ptrdiff_t"):
                    self.error(
                        t,
                        f"kernel '{kernel}': parameter '{names[-1].text}' has type "
                        f"{t.text}, which Metal does not allow as a kernel argument",
                    )
            result.append(
                Parameter(
                    names[-1].text,
                    plain,
                    [a for lst in attrs for a in lst.attributes],
                    any(t.text == "&" for t in plain),
                    any(t.text == "*" for t in plain),
                )
            )
        return result

    # ---- glue ----

    def argument(self, kernel, parameter):
        where = f"kernel '{kernel}', parameter '{parameter.name}'"
        buffer = next((a for a in parameter.attributes if a.name == "buffer"), None)
        group = next((a for a in parameter.attributes if a.name == "__mfa_sim_threadgroup__"), None)
        gate = next((a for a in parameter.attributes if a.name == "function_constant"), None)
        builtin = next((a for a in parameter.attributes if a.name in BUILTINS), None)
        if buffer:
            index = " ".join(t.text for t in buffer.args)
            unbound = c_string(f"{where}: buffer({index}) is not bound")
            misaligned = c_string(f"{where}: buffer({index}) is not aligned for its type")
            if parameter.is_reference:
                if gate:
                    raise CodegenError(
                        f"{parameter.tokens[0].where()}: error: {where}: "
                        "optional (function-constant) buffers must be pointers"
                    )
                too_small = c_string(
                    f"{where}: buffer({index}) is smaller than the parameter's type"
                )
                return (
                    f"::mfa_sim_glue::buffer_reference(arguments, {index}, {unbound}, "
                    f"{too_small}, {misaligned})"
                )
            if not parameter.is_pointer:
                raise CodegenError(
                    f"{parameter.tokens[0].where()}: error: {where}: a "
                    "[[buffer(i)]] parameter must be a pointer or a reference"
                )
            required = "true"
            if gate:
                required = "(" + " ".join(t.text for t in gate.args) + ")"
            return (
                f"::mfa_sim_glue::buffer_pointer(arguments, {index}, {required}, "
                f"{unbound}, {misaligned})"
            )
        if group:
            index = " ".join(t.text for t in group.args)
            return (
                f"::mfa_sim_glue::threadgroup_pointer(arguments, {index}, "
                + c_string(f"{where}: threadgroup({index}) has no memory (length 0)")
                + ", "
                + c_string(f"{where}: threadgroup({index}) is not aligned for its type")
                + ")"
            )
        if builtin:
            return f"::mfa_sim_glue::builtin(thread.{builtin.name})"
        raise CodegenError(
            f"{parameter.tokens[0].where()}: error: {where}: no Metal binding "
            "attribute ([[buffer(i)]], [[threadgroup(i)]] or a built-in) that "
            "metal-sim supports"
        )

    def glue(self):
        """Each kernel's entry point and the file's function-constant setter, under the names
        the kernel table (kernel_table) refers to."""
        out = [f'\n# 1 "<metal-sim glue for {self.source}>"\n']
        for name, parameters in self.kernels.items():
            if self.only_kernel is not None and name != self.only_kernel:
                continue
            arguments = ",\n        ".join(self.argument(name, p) for p in parameters)
            out.append(
                f"void {entry_name(name)}(const ::mfa_sim_abi::ThreadInfo& thread, "
                f"const ::mfa_sim_abi::ArgumentTable& arguments) {{\n"
                f"    (void)thread;\n    (void)arguments;\n"
                f"    {name}(\n        {arguments});\n}}\n"
            )
        out.append(
            f"const char* {constants_name(self.source)}("
            "const ::mfa_sim_abi::ConstantTable& table) {\n"
            "    const char* error = nullptr;\n    (void)table;\n"
        )
        for name in self.constants:
            out.append(f"    if ((error = __mfa_sim_bind_{name}(table))) return error;\n")
        out.append("    return error;\n}\n")
        return "".join(out)

    def manifest(self):
        """What kernel_table needs to know of this file."""
        return {"source": self.source, "kernels": list(self.kernels)}

    def output(self):
        glue = self.glue()
        pieces = []
        position = 0
        for start, end, replacement in sorted(self.edits):
            if start < position:
                continue  # inside a span already rewritten (a constant declaration)
            pieces.append(self.text[position:start])
            pieces.append(replacement)
            position = end
        pieces.append(self.text[position:])
        return "".join(pieces) + glue


def entry_name(kernel):
    return f"mfa_sim_kernel_{kernel}"


def constants_name(source):
    stem = os.path.splitext(os.path.basename(source))[0]
    return "mfa_sim_constants_" + re.sub(r"\W", "_", stem)


def kernel_table(manifests):
    """The table of every kernel of a binary (mfa_sim_abi::kernels), sorted by name: each with
    its .metal file, the entry point that runs one of its threads, and the setter of its file's
    function constants. A name defined by two files is an error here, before anything runs."""
    files = {}  # kernel name -> manifest
    for manifest in manifests:
        for kernel in manifest["kernels"]:
            if kernel in files:
                raise CodegenError(
                    f"{manifest['source']}: error: kernel '{kernel}' is also defined in "
                    f"{files[kernel]['source']}: kernel names must be unique in a binary"
                )
            files[kernel] = manifest
    if not files:
        raise CodegenError("error: no kernel in " + ", ".join(m["source"] for m in manifests))
    out = [
        "// Generated by metal_sim_codegen.py: every kernel compiled into this binary, by name,\n"
        "// with the function that runs one of its threads and the one that sets its file's\n"
        "// function constants. mfa::sim::dispatch finds kernels here.\n"
        '#include "mfa_sim_abi.h"\n\n'
    ]
    for kernel in sorted(files):
        out.append(
            f"void {entry_name(kernel)}(const mfa_sim_abi::ThreadInfo&, "
            "const mfa_sim_abi::ArgumentTable&);\n"
        )
    for source in sorted({m["source"] for m in manifests}):
        out.append(f"const char* {constants_name(source)}(const mfa_sim_abi::ConstantTable&);\n")
    out.append("\nconst mfa_sim_abi::KernelRecord mfa_sim_abi::kernels[] = {\n")
    for kernel in sorted(files):
        source = files[kernel]["source"]
        out.append(
            f"    {{{c_string(kernel)}, {c_string(source)}, {entry_name(kernel)}, "
            f"{constants_name(source)}}},\n"
        )
    out.append(
        "};\nconst unsigned mfa_sim_abi::kernel_count = sizeof kernels / sizeof kernels[0];\n"
    )
    return "".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "inputs",
        nargs="+",
        help="the preprocessed .metal file; with --kernel-table, the manifests of a binary",
    )
    parser.add_argument("-o", "--output", required=True)
    parser.add_argument("--source", help="the .metal file, for messages")
    parser.add_argument("--manifest", help="also write the file's kernels here, for the table")
    parser.add_argument(
        "--address-spaces",
        action="store_true",
        help="emit clang address spaces on pointers, for a type-checking pass "
        "(preprocess with -DMFA_SIM_ADDRESS_SPACE_CHECK=1)",
    )
    parser.add_argument(
        "--kernel-table", action="store_true", help="write the kernel table of a binary"
    )
    parser.add_argument(
        "--fold-constants",
        metavar="JSON",
        help='compile function constants in as constexpr values, {"index": value, ...}',
    )
    parser.add_argument(
        "--only-kernel",
        metavar="NAME",
        help="compile only this kernel (the others become unused static functions, with no glue)",
    )
    args = parser.parse_args()
    if not args.kernel_table and (len(args.inputs) != 1 or not args.source):
        parser.error("compiling a kernel file takes one preprocessed file and --source")
    try:
        if args.kernel_table:
            manifests = []
            for path in args.inputs:
                with open(path, encoding="utf-8") as f:
                    manifests.append(json.load(f))
            result = kernel_table(manifests)
        else:
            with open(args.inputs[0], encoding="utf-8") as f:
                folded = json.loads(args.fold_constants) if args.fold_constants else None
                codegen = Codegen(
                    f.read(), args.source, args.address_spaces, folded, args.only_kernel
                )
            if args.only_kernel and args.only_kernel not in codegen.kernels:
                raise CodegenError(f"{args.source}: error: no kernel '{args.only_kernel}'")
            result = codegen.output()
            if args.manifest:
                with open(args.manifest, "w", encoding="utf-8") as f:
                    json.dump(codegen.manifest(), f)
    except CodegenError as e:
        print(e, file=sys.stderr)
        return 1
    with open(args.output, "w", encoding="utf-8") as f:
        f.write(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
