"""Rule 11: a policy server that runs ``rolloutbus serve --engine vllm`` gets what vLLM needs (the project's Python).

- an image with vLLM in it: compose builds it from a ``deploy/Dockerfile`` stage (``build.target``) whose
  ``ENV ROLLOUTBUS_VLLM_PYTHON`` names the python of a virtualenv that a stage of the same file makes and
  installs ``vllm==<version>`` into (copied into the target, or made there), that version being the one
  ``make test`` runs on the CPU (``trainer.vllm_venv.VLLM_VERSION``: one extension, one reload path); k8s
  runs an image other than the one its other processes run (that one has no vLLM);
- an NVIDIA GPU: a compose device reservation with ``capabilities: [gpu]``, a k8s ``nvidia.com/gpu`` limit;
  and a Deployment holding a GPU per pod updates without asking for one more (``Recreate`` or ``maxSurge: 0``);
- a model vLLM can load: not ``--model tiny`` (the project's char model, which ``--engine vllm`` refuses), and
  trainers beside it that start from a Hugging Face model (their default, ``tiny``, is what they would publish).

Which routes its probes may use is rule 4's (wiring.py, from the gate's own module: facts.routes_for).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from facts import vllm_version
from model import DOCKERFILE, ComposeFile, Kustomization, Stage, dockerfile_stages, stage_chain, stage_env, under
from processes import Process, Processes

PYTHON_ENV = "ROLLOUTBUS_VLLM_PYTHON"
GPU = "nvidia.com/gpu"


def _vllm(processes: Processes) -> list[Process]:
    return [p for p in processes if p.ns.command == "serve" and getattr(p.settings, "serve_engine", "torch") == "vllm"]


def _model(p: Process) -> list[str]:
    if getattr(p.settings, "serve_model", None) == "tiny":
        return [f"{p.container.where}: `serve --engine vllm` loads a Hugging Face model directory, not --model tiny "
                "(the project's char model): leave --model out to serve the versions the trainer publishes"]
    return []


def _trainers(vllm: list[Process], trainers: list[Process]) -> list[str]:
    """Each vLLM server beside a trainer that publishes the tiny char model (its default): vLLM cannot load it."""
    tiny = [t.container.where for t in trainers if t.ns.command == "train" and getattr(t.settings, "train_model", "") == "tiny"]
    return [f"{p.container.where}: {where} trains and publishes the tiny char model (no --model), which vLLM cannot load: "
            "start it from a Hugging Face model directory (--model DIR / ROLLOUTBUS_TRAIN_MODEL)" for p in vllm for where in tiny]


# --------------------------------------------------------------------------- the image (deploy/Dockerfile)


def _arg_defaults(stage: Stage) -> dict[str, str]:
    return dict(re.findall(r"^ARG\s+([A-Za-z_][A-Za-z0-9_]*)=(\S+)", "\n".join(stage.instructions), re.M))


def image_problems(target: str, path: Path = DOCKERFILE) -> list[str]:
    """Why ``path``'s stage ``target`` does not give ``serve --engine vllm`` the vLLM ``make test`` runs; [] when it does."""
    stages = dockerfile_stages(path)
    where = f"{path.name} --target {target}"
    if not any(s.name == target for s in stages):
        return [f"{where}: no such stage (have {sorted(s.name for s in stages if s.name)})"]
    python = stage_env(stages, target).get(PYTHON_ENV)
    if not python:
        return [f"{where}: sets no ENV {PYTHON_ENV}: `serve --engine vllm` would install vLLM's CPU build at start"]
    venv = python.rsplit("/bin/", 1)[0]
    chain = stage_chain(stages, target)
    makers = [s for s in stages if any(re.search(rf"-m venv\s+{re.escape(venv)}(\s|$)", i) for i in s.instructions)]
    if not makers:
        return [f"{where}: {PYTHON_ENV}={python}, but no stage makes the virtualenv {venv}"]
    maker = makers[0]
    copied = bool(maker.name) and any(under(venv, m.group(1)) for s in chain for i in s.instructions
                                      if (m := re.match(rf"COPY\s+--from={re.escape(maker.name)}\s+(\S+)\s", i)))
    problems = []
    if maker not in chain and not copied:
        problems.append(f"{where}: the virtualenv {venv} is made in stage {maker.name or '(unnamed)'}, which the target "
                        f"neither is built from nor copies it from (COPY --from={maker.name} {venv} {venv})")
    args = _arg_defaults(maker)
    pins = {re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), v)
            for i in maker.instructions for v in re.findall(r"\bvllm==([^\s\"']+)", i)}
    if not pins:
        problems.append(f"{where}: stage {maker.name} installs no pinned vllm==<version> into {venv}")
    elif pins != {vllm_version()}:
        problems.append(f"{where}: installs vllm {', '.join(sorted(pins))}, but `make test` runs the worker extension and "
                        f"reload path against {vllm_version()} (trainer.vllm_venv.VLLM_VERSION): pin the same version")
    if stages[-1].name == target or (not stages[-1].name and stage_env(stages, stages[-1].base).get(PYTHON_ENV)):
        problems.append(f"{path.name}: the default target (its last stage) is the vLLM one: every process kind's image "
                        "would carry vLLM (GBs); keep it last-but-not-default")
    return problems


# --------------------------------------------------------------------------- compose


def _gpu_reserved(service: dict[str, Any]) -> bool:
    devices = (((service.get("deploy") or {}).get("resources") or {}).get("reservations") or {}).get("devices") or []
    return any("gpu" in (d.get("capabilities") or []) for d in devices)


def compose(f: ComposeFile, procs: Processes) -> list[str]:
    """Rule 11 (compose, the base and the files layered on it): vLLM in the image, a GPU reserved, a real model."""
    problems = []
    vllm = _vllm(procs)
    trainers = list(procs)
    if f.base is not None and vllm:  # the base's trainers run too, unless this file overrides them
        mine = {c.declared_in for c in f.containers}
        base = ComposeFile(f.path.with_name("(base)"), f.base)
        trainers += [q for q in Processes(base.containers) if q.container.declared_in not in mine]
    problems += _trainers(vllm, trainers)
    for p in vllm:
        svc = p.container.declared_in
        spec = f.merged(svc) if f.base is not None else f.services[svc]
        where = p.container.where
        if not _gpu_reserved(spec):
            problems.append(f"{where}: `serve --engine vllm` needs a GPU: reserve one (deploy.resources.reservations.devices: "
                            "[{driver: nvidia, count: 1, capabilities: [gpu]}])")
        if PYTHON_ENV not in p.container.env and PYTHON_ENV not in (spec.get("environment") or {}):
            target = (spec.get("build") or {}).get("target") if isinstance(spec.get("build"), dict) else None
            if not target:
                problems.append(f"{where}: `serve --engine vllm` needs an image with vLLM: build it from deploy/Dockerfile "
                                f"with `target: policy-vllm` (or set {PYTHON_ENV})")
            else:
                problems += [f"{where}: {x}" for x in image_problems(target)]
        problems += _model(p)
    return problems


# --------------------------------------------------------------------------- k8s


def k8s(k: Kustomization, procs: Processes) -> list[str]:
    """Rule 11 (k8s): an image of its own (with vLLM), a GPU limit, updates that do not ask for a second GPU."""
    problems = []
    vllm = _vllm(procs)
    others = {p.container.spec.get("image") for p in procs if not any(p.container is v.container for v in vllm)}
    problems += _trainers(vllm, list(procs))
    for p in vllm:
        c, where = p.container, p.container.where
        image = c.spec.get("image")
        if image in others:
            problems.append(f"{where}: runs {image}, the image of the other processes, which has no vLLM: build "
                            "deploy/Dockerfile --target policy-vllm and set it (kustomize images:)")
        limits = (c.spec.get("resources") or {}).get("limits") or {}
        if int(str(limits.get(GPU, 0)) or 0) < 1:
            problems.append(f"{where}: `serve --engine vllm` needs a GPU: resources.limits {{{GPU}: 1}}")
        elif c.kind == "Deployment":
            strategy = c.obj.get("spec", {}).get("strategy") or {}
            surge = str((strategy.get("rollingUpdate") or {}).get("maxSurge", "25%"))
            if strategy.get("type", "RollingUpdate") == "RollingUpdate" and surge not in ("0", "0%"):
                problems.append(f"{where}: a rolling update starts a new pod, and asks for another GPU, before the old one "
                                "lets its GPU go: set strategy {type: Recreate} (or rollingUpdate.maxSurge: 0)")
        problems += _model(p)
    return problems
