"""MkDocs hook: the C API page, rendered from native/include/mfa.h at every build.

The page's source (docs/c-api.md) holds the marker below; it is replaced by the header's
sections (its banner comments), and in each, every declaration with the comment written right
above it. The header is the reference: this only lays it out, so the page cannot drift from it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

MARKER = "<!-- mfa.h -->"
HEADER = Path(__file__).resolve().parents[2] / "native" / "include" / "mfa.h"

_BANNER_RULE = re.compile(r"^/\* -{20,} \*/$")
_CPLUSPLUS_BLOCK = re.compile(r"^#ifdef __cplusplus$.*?^#endif$", re.MULTILINE | re.DOTALL)


def _comment_text(comment: str) -> str:
    """The text of a /* ... */ comment, without its markers and leading asterisks."""
    body = comment[2:-2]
    lines = [re.sub(r"^ ?\* ?", "", line.strip()) for line in body.strip().splitlines()]
    return "\n".join(lines).strip()


def _split(text: str) -> list[tuple[str, str]]:
    """The header as ("comment" | "code", text) items, in order. Declarations end at a
    semicolon outside braces; a #define line is one item; other directives are skipped."""
    text = _CPLUSPLUS_BLOCK.sub("", text)
    items: list[tuple[str, str]] = []
    position = 0
    while position < len(text):
        if text[position].isspace():
            position += 1
        elif text.startswith("/*", position):
            end = text.index("*/", position) + 2
            items.append(("comment", text[position:end]))
            position = end
        elif text[position] == "#":
            end = text.find("\n", position)
            end = len(text) if end < 0 else end
            line = text[position:end]
            if re.match(r"#\s*define\s+MFA_(?!H\b)\w+\s+\S", line):
                items.append(("code", line.strip()))
            position = end
        else:
            depth, end = 0, position
            while end < len(text):
                if text.startswith("/*", end):  # comments inside a declaration stay in it
                    end = text.index("*/", end) + 2
                    continue
                character = text[end]
                depth += character == "{"
                depth -= character == "}"
                end += 1
                if character == ";" and depth == 0:
                    break
            items.append(("code", text[position:end].strip()))
            position = end
    return items


def _declared_name(code: str) -> str:
    """The name a declaration introduces: a function, a typedef, or a macro."""
    for pattern in (
        r"^#\s*define\s+(\w+)",  # a macro
        r"\(\s*\*\s*(\w+)\s*\)\s*\(",  # a function pointer (typedef)
        r"^typedef\b.*?(\w+)\s*;$",  # a typedef: its last name
        r"(\w+)\s*\(",  # a function
        r"(\w+)\s*(?:\[[^]]*\])?\s*;$",  # a variable
    ):
        match = re.search(pattern, code, re.DOTALL)
        if match:
            return match.group(1)
    raise ValueError(f"mfa.h: cannot tell what this declares: {code!r}")


def render(header_text: str) -> str:
    """Markdown for the whole header."""
    items = _split(header_text)
    out: list[str] = []
    # The opening comment introduces the library.
    if items and items[0][0] == "comment":
        out.append("```text\n" + _comment_text(items[0][1]) + "\n```\n")
        items = items[1:]
    pending: list[str] = []  # comments waiting for the declaration they describe
    index = 0
    while index < len(items):
        kind, text = items[index]
        if kind == "comment" and _BANNER_RULE.match(text):
            # A banner: rule, title, rule.
            title = _comment_text(items[index + 1][1])
            out.append(f"## {title}\n")
            index += 3
            pending = []
            continue
        if kind == "comment":
            pending.append(_comment_text(text))
            index += 1
            continue
        group = [text]
        # Consecutive #defines (the version macros) form one block.
        while text.startswith("#") and index + 1 < len(items):
            following_kind, following = items[index + 1]
            if following_kind == "comment" and index + 2 < len(items):
                if items[index + 2][1].startswith("#"):
                    group.append(following)
                    group.append(items[index + 2][1])
                    index += 2
                    continue
            if following_kind == "code" and following.startswith("#"):
                group.append(following)
                index += 1
                continue
            break
        names = [_declared_name(code) for code in group if not code.startswith("/*")]
        out.append(f"### {', '.join(f'`{name}`' for name in names)}\n")
        out.append("```c\n" + "\n".join(group) + "\n```\n")
        for note in pending:
            # The header's own prefix "name(): " is the heading already.
            note = re.sub(rf"^{re.escape(names[0])}\(\):\s*", "", note)
            out.append(_prose(note))
        pending = []
        index += 1
    rendered = "\n".join(out)
    # Every function of the header must have come out as a heading of its own.
    functions = set(re.findall(r"^[\w* ]*?\b(mfa_\w+)\(", header_text, re.MULTILINE))
    missing = sorted(name for name in functions if f"### `{name}`" not in rendered)
    if missing:
        raise ValueError(f"the C API page lost these functions of mfa.h: {missing}")
    return rendered


def _prose(note: str) -> str:
    """A header comment as Markdown: indented lines (tables, formulas) stay preformatted."""
    blocks: list[str] = []
    paragraph: list[str] = []
    preformatted: list[str] = []

    def flush() -> None:
        if paragraph:
            blocks.append(" ".join(paragraph))
            paragraph.clear()
        if preformatted:
            blocks.append("```text\n" + "\n".join(preformatted) + "\n```")
            preformatted.clear()

    for line in note.splitlines():
        if line.startswith("  ") or (line.startswith("- ") and paragraph == []):
            if paragraph:
                flush()
            preformatted.append(line)
        else:
            if preformatted:
                flush()
            paragraph.append(line.strip())
    flush()
    return "\n\n".join(blocks) + "\n"


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, render(HEADER.read_text(encoding="utf-8")))
