"""The README stays one page and every page behind it is one working link away.

The README holds the short path, the layout and the configuration; each longer topic lives in
docs/<topic>.md. These checks keep that split from decaying: a README that grows past a page, a
page nobody links, or a link (or `#anchor`) that a moved or renamed section left dangling.
Anchors are computed as GitHub renders them, since that is where readers follow them.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO

README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
MAX_README_LINES = 300

_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
_CODE = re.compile(r"`[^`]*`")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The text without code blocks and code spans, where brackets are code, not links."""
    return _CODE.sub("", _FENCE.sub("", text))


def anchors(text: str) -> set[str]:
    """The `#fragment` of each heading as GitHub makes it: lowercased, punctuation dropped,
    spaces to hyphens, a repeated heading numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", _FENCE.sub("", text), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", _CODE.sub(lambda m: m.group(0)[1:-1], heading).lower())
        slug = slug.replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def relative_links(page: Path) -> list[str]:
    return [t for t in _LINK.findall(_prose(page.read_text()))
            if not re.match(r"[a-z][a-z0-9+.-]*:", t)]  # https:, mailto: ... are not ours


def broken_links(page: Path) -> list[str]:
    """Each relative link of `page` whose file, or whose anchor in that file, does not exist."""
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.is_file():
            broken.append(f"{target} (no file {file})")
        elif anchor and anchor not in anchors(file.read_text()):
            broken.append(f"{target} (no heading #{anchor} in {file.name})")
    return broken


def test_readme_is_one_page():
    lines = len(README.read_text().splitlines())
    assert lines < MAX_README_LINES, (
        f"README.md has {lines} lines; move the longer topic to docs/<topic>.md, "
        "linked in one line from the README")


def test_every_relative_link_resolves():
    broken = {p.relative_to(REPO).as_posix(): b for p in [README, *DOCS] if (b := broken_links(p))}
    assert not broken, broken


def test_every_docs_page_is_linked_from_the_readme():
    assert DOCS, "docs/ holds no pages"
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in relative_links(README)}
    assert not [p.name for p in DOCS if p.resolve() not in linked]


def test_a_dangling_link_or_anchor_is_reported(tmp_path):
    (tmp_path / "a.md").write_text("# Top part\n\n## The `x` (b) part\n\n```\n# not a heading\n```\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](a.md#the-x-b-part) [ok](a.md#top-part) [web](https://example.com)\n"
                    "[gone](b.md) [no anchor](a.md#not-a-heading) `[code](c.md)` [self](#nowhere)\n")
    assert [b.split(" ")[0] for b in broken_links(page)] == ["b.md", "a.md#not-a-heading",
                                                             "#nowhere"]
