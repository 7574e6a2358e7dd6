"""The docs name every entry of every registry: a credit mode, estimator, policy loss, algorithm, tracker, feedback
baseline or capture registered in the code and missing from the page that documents its kind fails here, so the
hand-written tables cannot fall behind the registries they describe. Pure (reads files)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from foundation.registry import Registry
from producers.capture import CAPTURES
from rolloutbus.trainer_api.algorithms import ALGORITHMS
from streams.baselines import FEEDBACK_BASELINES
from streams.credit import CREDIT
from streams.grouping import ESTIMATORS
from trainer.algorithms import TRAIN_ALGORITHMS
from trainer.policy_losses import POLICY_LOSSES
from foundation.trackers import TRACKERS

DOCS = Path(__file__).resolve().parents[2] / "docs"


def section(page: str, starts: str, ends: str | None = None) -> str:
    """The text of ``docs/<page>`` from the first line holding ``starts`` up to the next holding ``ends``."""
    text = (DOCS / page).read_text()
    i = text.index(starts)
    j = text.index(ends, i + len(starts)) if ends else len(text)
    return text[i:j]


WHERE = {
    "credit": (CREDIT, "training.md", "**What reaches the loss.**", "**Credit assignment, measured.**"),
    "estimators": (ESTIMATORS, "training.md", "**What reaches the loss.**", "**Credit assignment, measured.**"),
    "policy losses": (POLICY_LOSSES, "training.md", "**What reaches the loss.**", "**Credit assignment, measured.**"),
    "train algorithms": (TRAIN_ALGORITHMS, "architecture.md", "**Where to add.**", "## The Avro contract"),
    "fit algorithms": (ALGORITHMS, "architecture.md", "**Where to add.**", "## The Avro contract"),
    "captures": (CAPTURES, "architecture.md", "**Where to add.**", "## The Avro contract"),
    "trackers": (TRACKERS, "training.md", "**Experiment trackers.**", "**What reaches the loss.**"),
    "feedback baselines": (FEEDBACK_BASELINES, "architecture.md", "**Training on task-less traffic**", "\n\nBad records"),
}


@pytest.mark.parametrize("kind", list(WHERE))
def test_every_registered_name_is_documented(kind: str) -> None:
    registry, page, starts, ends = WHERE[kind]
    assert isinstance(registry, Registry)
    text = section(page, starts, ends)
    named = set(re.findall(r"`([^`]+)`", text))
    words = {w for quoted in named for w in re.split(r"[\s,=]+", quoted)}  # `--credit identical`, `a,b,c`
    # the project's own entries: not a test's toy, nor a library's family (verl:*), which its provider's page lists
    ours = [n for n in registry.names() if ":" not in n and not getattr(registry.get(n), "__module__", "").startswith("tests")]
    missing = [n for n in ours if n not in named and n not in words]
    assert ours and not missing, f"docs/{page} ({starts!r}) does not name the {kind} {missing}"
