"""The user documentation as the docs tests read it: its files, their fenced code blocks, headings and
relative links, and GitHub's anchors for headings.

The conventions (docs/README.md, "Examples are tested"): a fenced block whose info string is
`bash runnable` or `python runnable` runs against a local stack; every other `bash` / `python` block
must parse.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNNABLE = "runnable"
LANGUAGES = ("bash", "python")
_FENCE = re.compile(r"^(`{3,}|~{3,})\s*(.*)$")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_INLINE_CODE = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


@dataclass(frozen=True)
class Block:
    """One fenced code block: its file, its number in that file (0-based), the line its fence opens on
    (1-based), its language and the rest of its info string, and its text."""

    path: Path
    index: int
    line: int
    language: str
    flags: tuple[str, ...]
    code: str

    @property
    def runnable(self) -> bool:
        return RUNNABLE in self.flags

    @property
    def name(self) -> str:
        """`docs/api.md:123`, for test ids and messages."""
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def documents() -> list[Path]:
    """README.md, the pages of docs/ and the benchmark results files (they link each other)."""
    return [
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "benchmarks" / "results").glob("*.md")),
    ]


def split(text: str) -> tuple[list[tuple[int, str]], list[tuple[int, str, str, str]]]:
    """(prose lines, blocks) of a Markdown text: the lines outside fences as (line number, text), and
    each fenced block as (opening line number, language, rest of the info string, code)."""
    prose: list[tuple[int, str]] = []
    blocks: list[tuple[int, str, str, str]] = []
    fence: tuple[str, int, str] | None = None
    body: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        found = _FENCE.match(line)
        if fence is None and found:
            fence, body = (found.group(1), number, found.group(2).strip()), []
        elif fence is not None and found and found.group(1).startswith(fence[0]) and not found.group(2):
            language, _, rest = fence[2].partition(" ")
            blocks.append((fence[1], language, rest, "\n".join(body) + "\n"))
            fence = None
        elif fence is not None:
            body.append(line)
        else:
            prose.append((number, line))
    assert fence is None, f"a code fence opened on line {fence[1]} is never closed"
    return prose, blocks


def blocks(path: Path) -> list[Block]:
    """The fenced code blocks of the Markdown file `path`."""
    _, found = split(path.read_text(encoding="utf-8"))
    return [
        Block(path, index, line, language, tuple(rest.split()), code)
        for index, (line, language, rest, code) in enumerate(found)
    ]


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its rendered text (inline code, emphasis and link markup
    dropped), lower-cased, without punctuation but `-` and `_`, spaces as `-`."""
    text = _INLINE_CODE.sub(lambda m: m.group(2), heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[*]|(?<!\w)_|_(?!\w)", "", text).strip().lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LNM")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every `#anchor` of the Markdown file `path` (repeated headings get -1, -2, ... as on GitHub)."""
    prose, _ = split(path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose:
        heading = _HEADING.match(line)
        if not heading:
            continue
        base = slug(heading.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def paragraphs(path: Path) -> list[tuple[int, str]]:
    """(first line number, text with its lines joined by spaces) of each paragraph of `path` outside
    code blocks: a link or inline code may wrap onto the next line."""
    prose, _ = split(path.read_text(encoding="utf-8"))
    found: list[tuple[int, list[str]]] = []
    last = -1
    for number, line in prose:
        if not line.strip():
            continue
        if number != last + 1 or not found:
            found.append((number, []))
        found[-1][1].append(line.strip())
        last = number
    return [(number, " ".join(lines)) for number, lines in found]


def relative_links(path: Path) -> list[tuple[int, str]]:
    """(line number of its paragraph, target) of every link of `path` that is not an absolute URL,
    outside code."""
    links = []
    for number, text in paragraphs(path):
        for found in _LINK.finditer(_INLINE_CODE.sub("", text)):
            target = found.group(1)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
                links.append((number, target))
    return links
