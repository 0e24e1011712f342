"""The user documentation holds together: every relative link and anchor resolves, every shell and
Python block parses, the README stays a front page, and no page carries a run log or an issue number.

Runnable blocks are run by tests/e2e/test_docs_runnable.py; the conventions are in docs/README.md.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from urllib.parse import unquote

import pytest

from support.markdown import LANGUAGES, ROOT, Block, anchors, blocks, documents, relative_links, slug

DOCS = documents()
CODE = [block for path in DOCS for block in blocks(path) if block.language in LANGUAGES]
PAGES = [path for path in DOCS if path.parent.name != "results"]


def resolve(source: Path, target: str) -> tuple[Path, str]:
    """The file and the anchor a link of `source` names (`#x` alone: `source` itself)."""
    where, _, anchor = target.partition("#")
    path = (source.parent / unquote(where)).resolve() if where else source
    return path, unquote(anchor)


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        ("Token inference (`/v2`)", "token-inference-v2"),
        (
            "TokenHub dialect: inputs and results in your own buckets",
            "tokenhub-dialect-inputs-and-results-in-your-own-buckets",
        ),
        ("Permissions: what each function may do, and why", "permissions-what-each-function-may-do-and-why"),
        ("arm64 (Graviton)", "arm64-graviton"),
        ("The S3 inbox: a batch without an API call", "the-s3-inbox-a-batch-without-an-api-call"),
        ("`make bench`, 2026-11-30", "make-bench-2026-11-30"),
        ("snake_case and *emphasis*", "snake_case-and-emphasis"),
    ],
)
def test_anchors_are_made_as_github_makes_them(heading: str, expected: str) -> None:
    assert slug(heading) == expected


def test_a_repeated_heading_gets_a_numbered_anchor(tmp_path: Path) -> None:
    # Given a page with a heading twice, and a heading-like line inside a code block
    page = tmp_path / "page.md"
    page.write_text("# Setup\n\n## Setup\n\n```bash\n# not a heading\n```\n")

    # When its anchors are read / Then
    assert anchors(page) == {"setup", "setup-1"}


def test_links_are_found_across_line_breaks_and_outside_code(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "See [the\nAPI](docs/api.md#errors) and [AWS](https://aws.amazon.com), `[not](a-link.md)`.\n\n"
        "```bash\necho [no](link.md)\n```\n[top](#see)\n"
    )

    assert relative_links(page) == [(1, "docs/api.md#errors"), (7, "#see")]


@pytest.mark.parametrize("source", DOCS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(source: Path) -> None:
    broken = []
    for line, target in relative_links(source):
        path, anchor = resolve(source, target)
        if not path.exists():
            broken.append(f"line {line}: {target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"line {line}: {target}: no heading makes #{anchor} in {path.name}")
    assert broken == []


@pytest.mark.parametrize("block", CODE, ids=lambda block: block.name)
def test_every_shell_and_python_block_parses(block: Block) -> None:
    if block.language == "python":
        compile(block.code, block.name, "exec")
        return
    checked = subprocess.run(["bash", "-n"], input=block.code, capture_output=True, text=True)
    assert checked.stderr == ""
    assert checked.returncode == 0


def test_the_pages_and_their_runnable_examples_are_there() -> None:
    assert [str(path.relative_to(ROOT)) for path in PAGES] == [
        "README.md",
        "docs/README.md",
        "docs/api.md",
        "docs/architecture.md",
        "docs/console.md",
        "docs/deploy.md",
        "docs/local-stack.md",
        "docs/operations.md",
        "docs/performance.md",
        "docs/reliability.md",
    ]
    runnable = {block.path.name for block in CODE if block.runnable}
    assert runnable == {"README.md", "api.md", "deploy.md", "local-stack.md", "operations.md"}


def test_the_readme_is_a_front_page() -> None:
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 200


@pytest.mark.parametrize("source", PAGES, ids=lambda path: str(path.relative_to(ROOT)))
def test_the_pages_carry_no_issue_numbers_and_no_run_logs(source: Path) -> None:
    text = source.read_text(encoding="utf-8")
    assert re.findall(r"\bissues? #?\d+", text, re.I) == []
    # A run's log names its load or its machine's state; the pages link benchmarks/results/ instead
    assert re.findall(r"load average [\d.]+-[\d.]+|on this (?:loaded )?machine", text) == []
