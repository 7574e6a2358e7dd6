"""deploy/validate/rules.py: every rule written is registered, and runs in the step that reports it."""

from __future__ import annotations

import inspect
from pathlib import Path

import exposure
import rules
import structure
import wiring
from model import ComposeFile, Kustomization


def _rule_functions() -> set[str]:
    """Public functions of the rule modules that take (a compose file or kustomization, its processes)."""
    found = set()
    for module in (structure, wiring, exposure):
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            params = list(inspect.signature(fn).parameters.values())
            if fn.__module__ == module.__name__ and not name.startswith("_") and len(params) == 2 and params[1].annotation == "Processes":
                found.add(f"{module.__name__}.{name}")
    return found


def test_every_rule_function_is_in_the_list() -> None:
    registered = {f"{check.__module__}.{check.__name__}" for rule in rules.RULES for check in (rule.compose, rule.k8s) if check}
    assert _rule_functions() - registered == set()
    assert all(rule.step in rules.STEPS and (rule.compose or rule.k8s) for rule in rules.RULES)


def test_a_step_runs_its_own_rules_only(tmp_path: Path) -> None:
    """The compose and k8s steps (the tool venv's) check the files' shape; commands are the commands step's."""
    doc = {"services": {"trainer": {"image": "${ROLLOUTBUS_IMAGE}", "command": ["training"]}}}
    problems = rules.run("compose", ComposeFile(tmp_path / "docker-compose.yml", doc))
    assert "trainer: command ['training'] is not a rolloutbus subcommand" in "\n".join(problems)
    assert "services missing:" in problems[0]
    assert not any("does not parse" in p for p in problems)
    assert "service trainer: `rolloutbus training` does not parse:" in "\n".join(rules.run("commands", ComposeFile(tmp_path / "x.yml", doc)))
    assert rules.run("k8s", Kustomization("base", [])) == [
        "no KafkaTopic for rb.spans",
        "rb.batches must be a KafkaTopic with exactly 1 partition (the trainer reads groups in order)",
        "rb.resources must be a KafkaTopic with cleanup.policy: compact",
    ]
