"""Every rule of `make validate-deploy`, in one list, and the one way to run them over the model.

A rule is a function of one compose file or one kustomization (model.py) and its parsed processes
(processes.py), returning one line per problem. Each rule belongs to the step that reports it:

- ``compose`` and ``k8s``: rules on the files' shape (structure.py), reported with the schema checks by
  compose.py and k8s.py, which run in the tool venv and so never touch the project's code;
- ``commands``: rules over what the code makes of each process (wiring.py, exposure.py, analyst.py, vllm_policy.py),
  reported by commands.py with the project's Python.

A compose file layered on another (compose.local.yml, compose.gpu-vllm.yml) is checked only by the rules marked
``overrides``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable

import analyst
import exposure
import structure
import vllm_policy
import wiring
from model import ComposeFile, Kustomization
from processes import Processes

ComposeCheck = Callable[[ComposeFile, Processes], list[str]]
K8sCheck = Callable[[Kustomization, Processes], list[str]]
STEPS = ("compose", "k8s", "commands")


@dataclass(frozen=True)
class Rule:
    """What one rule checks, in which step, over compose files and/or kustomizations."""

    name: str
    step: str
    compose: ComposeCheck | None = None
    k8s: K8sCheck | None = None
    overrides: bool = False  # also checks a compose file layered on the base (compose.local.yml)


def _analyst_compose(f: ComposeFile, _: Processes) -> list[str]:
    return analyst.check_compose(f.doc, f.name, f.path.parent, f.base)


def _analyst_k8s(k: Kustomization, _: Processes) -> list[str]:
    return analyst.check_k8s(k.objs, k.name)


RULES: list[Rule] = [
    # the shape of docker-compose.yml (structure.py)
    Rule("the services the stack needs", "compose", compose=structure.required_services),
    Rule("three KRaft brokers in one quorum", "compose", compose=structure.kraft_brokers),
    Rule("passwords interpolated, never literal", "compose", compose=structure.passwords_interpolated),
    Rule("depends_on names a service", "compose", compose=structure.depends_on_services),
    Rule("rolloutbus services run a subcommand and reach every broker", "compose", compose=structure.compose_subcommands),
    Rule("the GPU trainer behind a profile with a GPU", "compose", compose=structure.gpu_trainer),
    # the shape of each kustomization (structure.py)
    Rule("secrets only in Secrets", "k8s", k8s=structure.secrets_in_secrets),
    Rule("stream workers within rb.spans partitions", "k8s", k8s=structure.workers_within_partitions),
    Rule("rb.batches has one partition", "k8s", k8s=structure.batches_one_partition),
    Rule("rb.resources is compacted", "k8s", k8s=structure.resources_compacted),
    Rule("containers and RayJobs run a subcommand", "k8s", k8s=structure.k8s_subcommands),
    Rule("Services select pods", "k8s", k8s=structure.services_select_pods),
    # what the code makes of each process (wiring.py, exposure.py, analyst.py), numbered as in commands.py
    Rule("1 commands parse with the rolloutbus CLI", "commands", wiring.commands_parse, wiring.commands_parse, overrides=True),
    Rule("2 ROLLOUTBUS_* variables are settings", "commands", wiring.compose_variables, wiring.k8s_variables, overrides=True),
    Rule("3 Kafka users' ACLs cover their processes", "commands", k8s=wiring.kafka_users),
    Rule("4 probes reach a served port and route", "commands", k8s=wiring.probes),
    Rule("4 Service ports reach a served port", "commands", k8s=wiring.service_ports),
    Rule("5 spools on persistent volumes", "commands", wiring.compose_spools, wiring.k8s_spools),
    Rule("6 the proxy's upstream exists", "commands", wiring.compose_upstream, wiring.k8s_upstream),
    Rule("7 runners reach the proxy by its base URL", "commands", wiring.compose_proxy_url, wiring.k8s_proxy_url),
    Rule("8 servers beyond loopback have their credentials", "commands", exposure.credentials, exposure.credentials),
    Rule("9 ports published on every interface ask for credentials", "commands", compose=exposure.published, overrides=True),
    Rule("10 a read-only analyst ClickHouse account", "commands", _analyst_compose, _analyst_k8s, overrides=True),
    Rule("11 the vLLM policy server has vLLM, a GPU and a real model", "commands", vllm_policy.compose, vllm_policy.k8s,
         overrides=True),
]


def run(step: str, target: ComposeFile | Kustomization) -> list[str]:
    """The problems the rules of ``step`` find in one compose file or kustomization."""
    assert step in STEPS, step
    procs = Processes(target.containers)
    problems: list[str] = []
    for rule in RULES:
        if rule.step != step:
            continue
        if isinstance(target, ComposeFile) and rule.compose and (target.base is None or rule.overrides):
            problems += rule.compose(target, procs)
        elif isinstance(target, Kustomization) and rule.k8s:
            problems += rule.k8s(target, procs)
    return problems


def report(step: str, problems: list[str], ok: str) -> int:
    """Print each problem on stderr (or ``ok`` on stdout when there is none), each line led by the step's
    name; the exit status: 1 when anything failed."""
    for p in problems:
        print(f"{step}: {p}", file=sys.stderr)
    if not problems:
        print(f"{step}: {ok}")
    return 1 if problems else 0
