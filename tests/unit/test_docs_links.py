"""README and docs/: every relative link names a file that exists, and every #anchor a heading in it.

The reference moved from README into docs/ and its sections are linked by heading; a renamed heading
or a moved file would leave a reader at a dead link without this.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "deploy" / "README.md"]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (``_`` kept), spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@cache
def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def links(page: Path) -> list[str]:
    return [m.group(1) for m in LINK.finditer(FENCE.sub("", page.read_text()))]


def test_slug_follows_github() -> None:
    assert slug("The write-ups' LangGraph SQL agent under `Trainer.fit`") == "the-write-ups-langgraph-sql-agent-under-trainerfit"
    assert slug("Learning from production traffic: `rolloutbus demo --production`") == \
        "learning-from-production-traffic-rolloutbus-demo---production"
    assert slug("What ran here (`make test-deploy`, tests/deploy/test_deploy_compose.py)") == \
        "what-ran-here-make-test-deploy-testsdeploytest_deploy_composepy"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


# A measured figure: a number with a unit of what was measured (a rate, a share, a time, a ratio, a size).
FIGURE = re.compile(r"\d(?:[\d,.]*\d)?\s?(?:%|µs|×|ms\b|min\b|s\b|GB\b|MB\b|points\b|spans/s\b|per CPU-s\b)")


def readme_blocks() -> list[str]:
    """README's paragraphs outside code blocks, each table with the paragraph before it (a code block's sample output
    and a table belong to the paragraph that introduces them, which says where they come from)."""
    blocks: list[str] = []
    for b in (b for b in FENCE.sub("", (ROOT / "README.md").read_text()).split("\n\n") if b.strip()):
        if b.lstrip().startswith("|") and blocks:
            blocks[-1] += "\n\n" + b  # a table belongs to the paragraph that introduces it
        else:
            blocks.append(b)
    return blocks


def raw_files(block: str) -> list[str]:
    return [target.split("#")[0] for target in LINK.findall(block) if target.startswith("bench/results/")]


def test_every_figure_readme_quotes_links_its_raw_results() -> None:
    """Each README paragraph or table that quotes a measured figure links the raw results it comes from, a file or
    folder under bench/results/ (the command, the machine, each run's numbers) that exists."""
    bare = [b.strip()[:120] for b in readme_blocks() if FIGURE.search(b) and not raw_files(b)]
    assert bare == [], "README figures without a bench/results/ link:\n" + "\n".join(bare)
    for b in readme_blocks():
        for target in raw_files(b):
            assert (ROOT / target).exists(), f"{target} (linked from README) does not exist"


def test_the_figure_check_sees_a_bare_figure() -> None:
    assert FIGURE.search("ended at 89.3% held-out") and not raw_files("ended at 89.3% held-out")
    assert raw_files("89.3% ([raw](bench/results/x.md#a))") == ["bench/results/x.md"]
