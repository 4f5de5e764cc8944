"""The documentation holds together: every relative link resolves, every page is reachable from the
README or docs/index.md, and the README stays a front page."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
# [text](target) with a relative target; anchors and external addresses are left out.
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _relative_links(page: Path) -> list[str]:
    targets = []
    for target in LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://", "mailto:", "#")):
            continue
        targets.append(target.split("#", 1)[0])
    return targets


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md")), ROOT / "benchmarks" / "results" / "README.md"]


def test_every_relative_link_resolves() -> None:
    broken = [
        f"{page.relative_to(ROOT)}: {target}"
        for page in _pages()
        for target in _relative_links(page)
        if target and not (page.parent / target).exists()
    ]
    assert not broken, "links to nothing (fix the path or drop the link):\n" + "\n".join(broken)


def test_every_doc_is_linked_from_the_readme_or_the_index() -> None:
    linked = {(ROOT / t).resolve() for t in _relative_links(ROOT / "README.md")}
    linked |= {(DOCS / t).resolve() for t in _relative_links(DOCS / "index.md")}
    orphans = [p.name for p in sorted(DOCS.glob("*.md")) if p.name != "index.md" and p.resolve() not in linked]
    assert not orphans, f"docs nobody can find (link them from docs/index.md): {orphans}"


def test_readme_is_a_front_page() -> None:
    """About 150 lines (issue 27): measurement narratives belong in benchmarks/results/README.md."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 160, f"README.md has {len(lines)} lines; move detail to docs/ or benchmarks/results/"
    setup = [line for line in lines[:20] if line.startswith("python3 dev.py")]
    assert [line.split("#")[0].strip() for line in setup] == ["python3 dev.py train", "python3 dev.py test"]
