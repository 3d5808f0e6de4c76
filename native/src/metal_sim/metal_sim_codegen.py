#!/usr/bin/env python3
"""Turns a preprocessed .metal file into C++ for the simulator, plus its binding glue.

Input: the output of the C++ preprocessor run over a .metal file with the simulator's
compatibility headers (MetalSimKernels.cmake), in which Metal's address-space keywords and
`kernel` are marker identifiers. Output: the same text with

  - the markers removed, and the [[...]] attribute lists that carry Metal meaning blanked out
    (C++ would ignore or reject them), every line kept where it was so diagnostics point at the
    .metal source;
  - program-scope function constants `constant T name [[function_constant(i)]];` and constants
    derived from them turned into thread-local variables with a per-dispatch setter, so that
    concurrent dispatches with different constants do not interfere;
  - appended glue: for every kernel, an entry point that binds each parameter from its
    attribute ([[buffer(i)]], [[threadgroup(i)]], built-ins), and a static registration of the
    kernels by host name.

Errors (an unsupported form, a parameter without a binding, a size_t argument, a threadgroup
variable inside a function) are reported as `file:line: error: ...` and fail the build.
"""

import argparse
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

# Built-in attribute -> the ThreadInfo field that holds it.
BUILTINS = {
    "thread_position_in_grid": "thread_position_in_grid",
    "thread_position_in_threadgroup": "thread_position_in_threadgroup",
    "threadgroup_position_in_grid": "threadgroup_position_in_grid",
    "threads_per_threadgroup": "threads_per_threadgroup",
    "dispatch_threads_per_threadgroup": "threads_per_threadgroup",
    "threadgroups_per_grid": "threadgroups_per_grid",
    "threads_per_grid": "threads_per_grid",
    "thread_index_in_threadgroup": "thread_index_in_threadgroup",
    "thread_index_in_simdgroup": "thread_index_in_simdgroup",
    "simdgroup_index_in_threadgroup": "simdgroup_index_in_threadgroup",
    "simdgroups_per_threadgroup": "simdgroups_per_threadgroup",
    "dispatch_simdgroups_per_threadgroup": "simdgroups_per_threadgroup",
    "threads_per_simdgroup": "threads_per_simdgroup",
    "thread_execution_width": "threads_per_simdgroup",
}

# Attributes that mean something to Metal: a [[...]] list holding one of them is consumed here.
METAL_ATTRIBUTES = set(BUILTINS) | {
    "buffer",
    "__mfa_sim_threadgroup__",
    "__mfa_sim_kernel__",
    "function_constant",
    "host_name",
    "max_total_threads_per_threadgroup",
    "texture",
    "sampler",
    "stage_in",
    "visible",
    "user",
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

    def is_metal(self):
        return any(a.name in METAL_ATTRIBUTES for a in self.attributes)


class Parameter:
    def __init__(self, name, tokens, attributes, is_reference, is_pointer):
        self.name, self.tokens, self.attributes = name, tokens, attributes
        self.is_reference, self.is_pointer = is_reference, is_pointer


class KernelFunction:
    def __init__(self, name, namespace, parameters, is_template, token):
        self.name, self.namespace, self.parameters = name, namespace, parameters
        self.is_template, self.token = is_template, token


class Codegen:
    def __init__(self, text, source, address_spaces):
        self.text = text
        self.source = source
        self.address_spaces = address_spaces
        self.tokens = tokenize(text)
        self.edits = []  # (start, end, replacement)
        self.attribute_lists = {}  # first token index -> AttributeList
        self.kernels = {}  # name -> KernelFunction (definitions)
        self.instantiations = []  # (host name, KernelFunction name, expression, namespace, token)
        self.constants = []  # (qualified namespace, name)
        self.constant_names = set()
        self.threadgroup_variables = 0  # threadgroup variables declared in kernel bodies

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
        scopes = []  # ("namespace", name) | ("extern", None) | ("class", None) | ("block", None)
        statement_start = 0
        i = 0
        while i < len(tokens):
            tok = tokens[i]
            if self.is_attribute_start(i):
                attrs = self.parse_attribute_list(i)
                self.attribute_lists[i] = attrs
                if attrs.is_metal():
                    self.blank(attrs.first, attrs.last)
                    if attrs.find("__mfa_sim_kernel__"):
                        self.on_kernel(i, attrs.last + 1, statement_start, scopes)
                i = attrs.last + 1
                continue
            if tok.kind == "identifier" and tok.text in MARKERS:
                at_namespace_scope = all(kind in ("namespace", "extern") for kind, _ in scopes)
                if (
                    tok.text == "__mfa_sim_constant__"
                    and at_namespace_scope
                    and i == statement_start
                ):
                    i = self.on_program_scope_constant(i, scopes)
                    statement_start = i
                    continue
                if (
                    tok.text == "__mfa_sim_threadgroup__"
                    and any(k == "block" for k, _ in scopes)
                    and i == statement_start
                    and self.is_variable_declaration(i)
                ):
                    i = self.on_threadgroup_variable(i)
                    statement_start = i
                    continue
                self.rewrite_marker(i)
                if tok.text == "__mfa_sim_kernel__":
                    self.on_kernel(i, i + 1, statement_start, scopes)
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

    def classify_brace(self, first, brace):
        words = [t.text for t in self.tokens[first:brace]]
        if "namespace" in words:
            k = words.index("namespace")
            name = (
                words[k + 1] if k + 1 < len(words) and re.match(r"[A-Za-z_]", words[k + 1]) else ""
            )
            return ("namespace", name)
        if words[:1] == ["extern"] and len(words) == 2 and words[1].startswith('"'):
            return ("extern", None)
        if (
            any(w in ("struct", "class", "union", "enum") for w in words)
            and "(" not in words
            and "=" not in words
        ):
            return ("class", None)
        return ("block", None)

    def namespace_of(self, scopes):
        return [name for kind, name in scopes if kind == "namespace"]

    def is_variable_declaration(self, i):
        """Whether the statement at marker i declares storage (not a pointer or reference)."""
        j = i + 1
        while j < len(self.tokens) and self.tokens[j].text not in (";", "=", "(", ")", ","):
            if self.tokens[j].text in ("*", "&"):
                return False
            j += 1
        return j < len(self.tokens) and self.tokens[j].text == ";"

    def on_threadgroup_variable(self, i):
        """threadgroup T name[dims]; inside a kernel -> a reference to per-threadgroup memory.

        The executor hands every thread of a threadgroup the same allocation for this
        declaration, sized and aligned for T[dims] and counted against the 32 KB limit."""
        end = i
        while self.tokens[end].text != ";":
            end += 1
        body = self.tokens[i + 1 : end]
        bracket = next((n for n, t in enumerate(body) if t.text == "["), len(body))
        if bracket < 2 or body[bracket - 1].kind != "identifier":
            self.error(
                self.tokens[i],
                "unsupported threadgroup variable declaration (one "
                "variable per declaration: threadgroup T name[N];)",
            )
        name = body[bracket - 1].text
        type_text = " ".join(t.text for t in body[: bracket - 1])
        dims = " ".join(t.text for t in body[bracket:])
        number = self.threadgroup_variables
        self.threadgroup_variables += 1
        alias = f"__mfa_sim_threadgroup_type_{number}"
        space = self.space_attribute("__mfa_sim_threadgroup__") + " " if self.address_spaces else ""
        self.replace(
            i,
            end,
            f"using {alias} = {space}{type_text} {dims}; "
            f"{alias}& {name} = *({alias}*)("
            f"::mfa_sim_threadgroup_variable({number}, sizeof({alias}), "
            f"alignof({alias})));",
        )
        return end + 1

    # ---- program-scope constants ----

    def on_program_scope_constant(self, i, scopes):
        """constant T name [[function_constant(n)]]; or constant T name = expression;"""
        end = i
        while self.tokens[end].text != ";":
            if self.is_attribute_start(end):
                end = self.parse_attribute_list(end).last
            end += 1
        body = list(range(i + 1, end))
        attrs = None
        for k in body:
            if k in self.attribute_lists or self.is_attribute_start(k):
                attrs = self.attribute_lists.get(k) or self.parse_attribute_list(k)
                break
        namespace = self.namespace_of(scopes)
        if attrs and attrs.find("function_constant"):
            index_tokens = attrs.find("function_constant").args
            name_token = self.tokens[attrs.first - 1]
            type_text = " ".join(t.text for t in self.tokens[i + 1 : attrs.first - 1])
            index_text = " ".join(t.text for t in index_tokens)
            self.declare_constant(
                i,
                end,
                namespace,
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
            derived = used & self.constant_names or any(
                name.startswith("__mfa_sim_fc_defined_") for name in used
            )
            if derived and not any(t.text == "," for t in self.tokens[i:equals]):
                name_token = self.tokens[equals - 1]
                type_text = " ".join(t.text for t in self.tokens[i + 1 : equals - 1])
                expression_text = " ".join(t.text for t in expression)
                self.declare_constant(
                    i,
                    end,
                    namespace,
                    name_token.text,
                    type_text,
                    f"(void)table; {name_token.text} = ({expression_text}); "
                    f"__mfa_sim_fc_defined_{name_token.text} = true; "
                    f"return nullptr;",
                )
                return end + 1
        self.rewrite_marker(i)
        return i + 1

    def declare_constant(self, first, last, namespace, name, type_text, setter_body):
        self.replace(
            first,
            last,
            f"__thread {type_text} {name}; "
            f"__thread bool __mfa_sim_fc_defined_{name}; "
            f"static const char* __mfa_sim_bind_{name}("
            f"const ::mfa_sim_abi::ConstantTable& table) {{ {setter_body} }}",
        )
        self.constants.append((namespace, name))
        self.constant_names.add(name)

    # ---- kernels ----

    def on_kernel(self, marker, after_marker, statement_start, scopes):
        words = [t.text for t in self.tokens[statement_start:marker]]
        namespace = self.namespace_of(scopes)
        explicit_instantiation = (
            len(words) >= 1 and words[0] == "template" and (len(words) < 2 or words[1] != "<")
        )
        if explicit_instantiation:
            self.on_instantiation(marker, statement_start, namespace)
            return
        # A definition: ... void NAME ( parameters ) { ... }
        j = after_marker
        while j < len(self.tokens) and self.tokens[j].text != "(":
            if self.is_attribute_start(j):
                j = self.parse_attribute_list(j).last
            j += 1
        name_token = self.tokens[j - 1]
        close = self.matching(j, "(", ")")
        after = self.tokens[close + 1].text if close + 1 < len(self.tokens) else ""
        if after == ";":
            return  # a declaration; the definition carries the bindings
        if after != "{":
            self.error(name_token, f"kernel '{name_token.text}': expected a function definition")
        parameters = self.parse_parameters(j, close, name_token.text)
        if name_token.text in self.kernels:
            self.error(
                name_token,
                f"kernel '{name_token.text}' is defined twice (overloaded "
                "kernels are not supported by metal-sim)",
            )
        self.kernels[name_token.text] = KernelFunction(
            name_token.text, namespace, parameters, "template" in words, name_token
        )

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
                    lst = self.attribute_lists.setdefault(index, self.parse_attribute_list(index))
                    attrs.append(lst)
                    last = lst.last
                    while k < len(indices) and indices[k] <= last:
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

    def on_instantiation(self, marker, statement_start, namespace):
        end = marker
        while self.tokens[end].text != ";":
            end += 1
        host_name = None
        body = []
        k = statement_start + 1
        while k < end:
            if k in self.attribute_lists:
                lst = self.attribute_lists[k]
                attribute = lst.find("host_name")
                if attribute:
                    host_name = "".join(t.text[1:-1] for t in attribute.args if t.kind == "string")
                k = lst.last + 1
                continue
            if self.is_attribute_start(k):
                lst = self.parse_attribute_list(k)
                k = lst.last + 1
                continue
            body.append(k)
            k += 1
        texts = [self.tokens[k].text for k in body]
        if texts and texts[0] == "decltype":
            close = self.matching(body[1], "(", ")")
            body = [k for k in body if k > close]
        else:
            paren = next((n for n, t in enumerate(texts) if t == "("), len(texts))
            body = body[1:paren]  # drop the return type, stop at the parameters
        expression = " ".join(self.tokens[k].text for k in body)
        angle = next((n for n, k in enumerate(body) if self.tokens[k].text == "<"), None)
        template_name = self.tokens[body[angle - 1]].text if angle else None
        if not host_name or not template_name:
            self.error(
                self.tokens[marker],
                "kernel instantiations need the form "
                'template [[host_name("name")]] [[kernel]] decltype(f<...>) f<...>;',
            )
        self.instantiations.append(
            (host_name, template_name, expression, namespace, self.tokens[marker])
        )

    # ---- glue ----

    def argument(self, kernel_host_name, parameter):
        where = f"kernel '{kernel_host_name}', parameter '{parameter.name}'"
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
            return f"::mfa_sim_glue::builtin(thread.{BUILTINS[builtin.name]})"
        raise CodegenError(
            f"{parameter.tokens[0].where()}: error: {where}: no Metal binding "
            "attribute ([[buffer(i)]], [[threadgroup(i)]] or a built-in) that "
            "metal-sim supports"
        )

    def glue(self):
        entries = []  # (host name, kernel, callee expression, namespace to call it from)
        for name, kernel in self.kernels.items():
            if not kernel.is_template:
                entries.append((name, kernel, name, kernel.namespace))
        for host_name, template_name, expression, namespace, token in self.instantiations:
            kernel = self.kernels.get(template_name)
            if not kernel:
                self.error(
                    token,
                    f"kernel instantiation '{host_name}': no kernel template "
                    f"'{template_name}' in this file",
                )
            entries.append((host_name, kernel, expression, namespace))
        out = [f'\n# 1 "<metal-sim glue for {self.source}>"\n']
        qualified_entries = []
        for number, (host_name, kernel, callee, namespace) in enumerate(entries):
            arguments = ",\n        ".join(self.argument(host_name, p) for p in kernel.parameters)
            opening = "".join(f"namespace {n} {{ " for n in namespace)
            closing = "}" * len(namespace)
            out.append(
                f"{opening}\n"
                f"static void __mfa_sim_entry_{number}(const ::mfa_sim_abi::ThreadInfo& thread, "
                f"const ::mfa_sim_abi::ArgumentTable& arguments) {{\n"
                f"    (void)thread;\n    (void)arguments;\n"
                f"    {callee}(\n        {arguments});\n}}\n{closing}\n"
            )
            prefix = "".join(f"{n}::" for n in namespace if n)
            qualified_entries.append((host_name, f"::{prefix}__mfa_sim_entry_{number}"))
        out.append(
            "static const char* __mfa_sim_setup_constants("
            "const ::mfa_sim_abi::ConstantTable& table) {\n"
            "    const char* error = nullptr;\n    (void)table;\n"
        )
        for namespace, name in self.constants:
            prefix = "".join(f"{n}::" for n in namespace if n)
            out.append(f"    if ((error = ::{prefix}__mfa_sim_bind_{name}(table))) return error;\n")
        out.append("    return error;\n}\n")
        if qualified_entries:
            out.append("static const ::mfa_sim_abi::KernelRecord __mfa_sim_kernels[] = {\n")
            for host_name, entry in qualified_entries:
                out.append(
                    f"    {{{c_string(host_name)}, {c_string(self.source)}, {entry}, "
                    f"__mfa_sim_setup_constants}},\n"
                )
            out.append(
                "};\n"
                "namespace {\n"
                "struct __mfa_sim_registrar {\n"
                "    __mfa_sim_registrar() {\n"
                "        mfa_sim_register_kernels(__mfa_sim_kernels, "
                f"{len(qualified_entries)});\n"
                "    }\n"
                "} const __mfa_sim_registrar_instance;\n"
                "}\n"
            )
        return "".join(out)

    def output(self):
        self.run()
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("preprocessed")
    parser.add_argument("-o", "--output", required=True)
    parser.add_argument("--source", required=True, help="the .metal file, for messages")
    parser.add_argument(
        "--address-spaces",
        action="store_true",
        help="emit clang address spaces on pointers, for a type-checking pass "
        "(preprocess with -DMFA_SIM_ADDRESS_SPACE_CHECK=1)",
    )
    args = parser.parse_args()
    with open(args.preprocessed, encoding="utf-8") as f:
        text = f.read()
    try:
        result = Codegen(text, args.source, args.address_spaces).output()
    except CodegenError as e:
        print(e, file=sys.stderr)
        return 1
    with open(args.output, "w", encoding="utf-8") as f:
        f.write(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
