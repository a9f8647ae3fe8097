"""The documentation stays navigable and short: every relative Markdown link in README.md,
ARCHITECTURE.md, docs/*.md and benchmarks/README.md names an existing file (and, when it has
an ``#anchor`` into a Markdown file, an existing heading there), and the two front pages fit
on a screen or two."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted(
    [ROOT / "README.md", ROOT / "ARCHITECTURE.md", ROOT / "benchmarks" / "README.md"]
    + list((ROOT / "docs").glob("*.md"))
)
MAX_LINES = {"README.md": 160, "ARCHITECTURE.md": 210}

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def _prose(text: str) -> str:
    """The page without fenced code blocks and code spans (their brackets are not links)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, repeats
    numbered."""
    seen: dict[str, int] = {}
    anchors = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def broken_links(page: Path) -> list[str]:
    """Each relative link of ``page`` whose file (or Markdown anchor) does not exist."""
    broken = []
    for target in LINK.findall(_prose(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
            continue  # http:, https:, mailto: ...
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            broken.append(f"{target} (no file {os.path.relpath(dest, ROOT)})")
        elif anchor and dest.suffix == ".md" and anchor.lower() not in _anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {dest.name})")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_resolves(page: Path) -> None:
    assert not broken_links(page), f"{page.relative_to(ROOT)}: broken links {broken_links(page)}"


@pytest.mark.parametrize("name", sorted(MAX_LINES))
def test_front_pages_stay_short(name: str) -> None:
    lines = len((ROOT / name).read_text().splitlines())
    assert lines <= MAX_LINES[name], f"{name} has {lines} lines (at most {MAX_LINES[name]})"


def test_the_checker_finds_a_broken_link_and_anchor(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# A heading\n\n## `code` and more: here\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md) [ok](other.md#a-heading) [ok](other.md#code-and-more-here)\n"
        "[gone](missing.md) [bad anchor](other.md#nope) [web](https://example.com/x)\n"
        "`[not a link](nowhere.md)`\n```\n[nor this](nowhere.md)\n```\n"
    )
    assert broken_links(page) == [
        f"missing.md (no file {os.path.relpath(tmp_path / 'missing.md', ROOT)})",
        "other.md#nope (no heading #nope in other.md)",
    ]
