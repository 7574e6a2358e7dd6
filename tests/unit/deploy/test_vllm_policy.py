"""deploy/validate/vllm_policy.py (rule 11): the GPU policy server that runs `rolloutbus serve --engine vllm`.

The files as they are pass, and they do run the vLLM engine (so the rule is not vacuous); then each test breaks
one thing the way a GPU deployment goes wrong (no GPU, the image without vLLM, a vLLM other than the one
`make test` ran, a rolling update that asks for a second GPU, the char model) and asserts the rule names it.
"""

from __future__ import annotations

import copy
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

import commands
import facts
import model
import vllm_policy
from deploy_tools import ROOT, run_tool

DEPLOY = ROOT / "deploy"
OVERLAY = "overlays/gpu-vllm"
GPU_COMPOSE = DEPLOY / "compose.gpu-vllm.yml"


@pytest.fixture(scope="module")
def overlay(tools: dict[str, str]) -> list[dict[str, Any]]:
    return model.render(model.K8S / OVERLAY, shlex.split(tools["KUSTOMIZE"]))


def _policy(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "rolloutbus-policy")


def _rule11(objs: list[dict[str, Any]]) -> str:
    return "\n".join(commands.check_k8s(objs, OVERLAY))


def test_the_gpu_overlay_and_compose_file_run_the_vllm_engine_and_pass(overlay: list[dict[str, Any]], tools: dict[str, str]) -> None:
    k = model.Kustomization(OVERLAY, overlay)
    engines = [(p.container.where, p.settings.serve_engine) for p in commands.rules.Processes(k.containers) if p.ns.command == "serve"]
    assert engines == [(f"{OVERLAY}: Deployment/rolloutbus-policy container policy", "vllm")]
    assert _rule11(overlay) == ""
    base = model.load_compose(DEPLOY / "docker-compose.yml")
    layered = model.ComposeFile(GPU_COMPOSE, model.load_compose(GPU_COMPOSE), base)
    assert [c.argv[:3] for c in layered.containers if c.argv[0] == "serve"] == [["serve", "--engine", "vllm"]]
    assert [c.argv[-2:] for c in layered.containers if c.argv[0] == "train"] == [["--model", "/models/base"]] * 2
    assert commands.check_compose(GPU_COMPOSE, base) == []
    proc = run_tool(tools, "import compose; raise SystemExit(compose.main([]))")  # the schema, in the tool venv
    assert proc.returncode == 0 and "compose.gpu-vllm.yml against the schema" in proc.stdout, proc.stderr
    # the image's vLLM is the one make test runs; the default target carries none
    assert vllm_policy.image_problems("policy-vllm") == []
    stages = model.dockerfile_stages()
    assert "ROLLOUTBUS_VLLM_PYTHON" not in model.stage_env(stages, stages[-1].base) and not stages[-1].instructions


def test_k8s_without_a_gpu_with_the_base_image_or_a_rolling_update_fails(overlay: list[dict[str, Any]]) -> None:
    objs = copy.deepcopy(overlay)
    policy = _policy(objs)
    c = policy["spec"]["template"]["spec"]["containers"][0]
    del c["resources"]["limits"]["nvidia.com/gpu"]
    runner = next(o for o in objs if o["metadata"]["name"] == "rolloutbus-runner" and o["kind"] == "StatefulSet")
    c["image"] = runner["spec"]["template"]["spec"]["containers"][0]["image"]
    problems = _rule11(objs)
    assert "container policy: `serve --engine vllm` needs a GPU: resources.limits {nvidia.com/gpu: 1}" in problems
    assert "container policy: runs ghcr.io/example/rolloutbus:0.1.0, the image of the other processes, which has no vLLM" in problems

    objs = copy.deepcopy(overlay)
    del _policy(objs)["spec"]["strategy"]
    assert "a rolling update starts a new pod, and asks for another GPU" in _rule11(objs)
    _policy(objs)["spec"]["strategy"] = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    assert _rule11(objs) == ""


def test_k8s_the_char_model_and_a_probe_the_gate_does_not_answer_fail(overlay: list[dict[str, Any]]) -> None:
    objs = copy.deepcopy(overlay)
    c = _policy(objs)["spec"]["template"]["spec"]["containers"][0]
    c["args"] += ["--model", "tiny"]
    c["readinessProbe"]["httpGet"]["path"] = "/health"  # vLLM's own route, on the engine's loopback port only
    problems = _rule11(objs)
    assert "`serve --engine vllm` loads a Hugging Face model directory, not --model tiny" in problems
    assert "readinessProbe: path /health is not a GET route of `rolloutbus serve` (['/healthz', '/v1/models'])" in problems


def test_both_engines_routes_are_read_from_their_one_route_table() -> None:
    """``serve --engine torch`` and the vLLM gate answer one route table (trainer/serve_http.py ``openai_app``), and the
    deploy check reads the probes' paths from it."""
    from aiohttp import web

    from trainer.serve_http import openai_app
    from trainer.vllm_serve import VllmGate

    vllm = type("S", (), {"serve_engine": "vllm"})()
    torch = type("S", (), {"serve_engine": "torch"})()
    assert facts.routes_for("serve", vllm) == facts.routes_for("serve", torch) == {"/healthz", "/v1/models"}
    server = object.__new__(VllmGate)  # the routes only: no engine, no checkpoint
    server.token = None
    gate = openai_app(server)
    gets = {r.resource.canonical for r in gate.router.routes() if r.method == "GET"}
    assert gets == facts.get_routes("serve") and isinstance(gate, web.Application)


def _compose_problems(tmp_path: Path, edit: Any) -> str:
    doc = yaml.safe_load(GPU_COMPOSE.read_text())
    edit(doc["services"]["policy"])
    path = tmp_path / "compose.gpu-vllm.yml"
    path.write_text(yaml.safe_dump(doc))
    return "\n".join(commands.check_compose(path, model.load_compose(DEPLOY / "docker-compose.yml")))


def test_compose_without_a_gpu_or_a_vllm_image_fails(tmp_path: Path) -> None:
    def no_gpu(s: dict[str, Any]) -> None:
        del s["deploy"]

    def no_build(s: dict[str, Any]) -> None:
        del s["build"]

    def other_stage(s: dict[str, Any]) -> None:
        s["build"]["target"] = "rolloutbus"

    assert "service policy: `serve --engine vllm` needs a GPU: reserve one" in _compose_problems(tmp_path, no_gpu)
    assert "service policy: `serve --engine vllm` needs an image with vLLM: build it from deploy/Dockerfile with " \
           "`target: policy-vllm`" in _compose_problems(tmp_path, no_build)
    assert "service policy: Dockerfile --target rolloutbus: sets no ENV ROLLOUTBUS_VLLM_PYTHON" in _compose_problems(tmp_path, other_stage)


def _dockerfile(tmp_path: Path, old: str, new: str) -> Path:
    text = (DEPLOY / "Dockerfile").read_text()
    assert old in text
    path = tmp_path / "Dockerfile"
    path.write_text(text.replace(old, new))
    return path


def test_the_image_must_carry_the_vllm_make_test_ran_and_not_by_default(tmp_path: Path) -> None:
    path = _dockerfile(tmp_path, f"ARG VLLM_VERSION={facts.vllm_version()}", "ARG VLLM_VERSION=0.27.1")
    assert vllm_policy.image_problems("policy-vllm", path) == [
        f"Dockerfile --target policy-vllm: installs vllm 0.27.1, but `make test` runs the worker extension and reload path "
        f"against {facts.vllm_version()} (trainer.vllm_venv.VLLM_VERSION): pin the same version"]
    path = _dockerfile(tmp_path, "COPY --from=vllm /opt/vllm /opt/vllm\n", "")
    assert "the virtualenv /opt/vllm/venv is made in stage vllm, which the target neither is built from nor copies it" \
        in "\n".join(vllm_policy.image_problems("policy-vllm", path))
    path = _dockerfile(tmp_path, "ENV ROLLOUTBUS_VLLM_PYTHON=/opt/vllm/venv/bin/python\n", "")
    assert vllm_policy.image_problems("policy-vllm", path) == [
        "Dockerfile --target policy-vllm: sets no ENV ROLLOUTBUS_VLLM_PYTHON: `serve --engine vllm` would install vLLM's CPU build at start"]
    path = _dockerfile(tmp_path, "\n# The default target: every process kind, no vLLM.\nFROM rolloutbus\n", "\n")
    assert "the default target (its last stage) is the vLLM one" in "\n".join(vllm_policy.image_problems("policy-vllm", path))
    assert vllm_policy.image_problems("gpu", path) == [
        "Dockerfile --target gpu: no such stage (have ['policy-vllm', 'python', 'requirements', 'rolloutbus', 'vllm'])"]


def test_a_schema_violation_in_the_gpu_compose_file_is_reported(tools: dict[str, str], tmp_path: Path) -> None:
    doc = yaml.safe_load(GPU_COMPOSE.read_text())
    doc["services"]["policy"]["shm_size"] = ["8gb"]  # a string or a number
    path = tmp_path / "compose.gpu-vllm.yml"
    path.write_text(yaml.safe_dump(doc))
    proc = run_tool(tools, f"import compose; from pathlib import Path; print(compose.overlay_errors(Path({str(path)!r})))")
    assert proc.returncode == 0 and "compose.gpu-vllm.yml: services/policy/shm_size" in proc.stdout, proc.stdout + proc.stderr


def test_a_trainer_beside_it_that_publishes_the_tiny_char_model_fails(overlay: list[dict[str, Any]], tmp_path: Path) -> None:
    objs = copy.deepcopy(overlay)
    trainer = next(o for o in objs if o["kind"] == "StatefulSet" and o["metadata"]["name"] == "rolloutbus-trainer")
    args = trainer["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[-2:] == ["--model", "/models/base"]
    del args[-2:]
    assert ("container policy: overlays/gpu-vllm: StatefulSet/rolloutbus-trainer container trainer trains and publishes the "
            "tiny char model (no --model), which vLLM cannot load") in _rule11(objs)

    doc = yaml.safe_load(GPU_COMPOSE.read_text())
    del doc["services"]["trainer"], doc["services"]["trainer-gpu"]  # the base's trainers run as they are
    path = tmp_path / "compose.gpu-vllm.yml"
    path.write_text(yaml.safe_dump(doc))
    problems = "\n".join(commands.check_compose(path, model.load_compose(DEPLOY / "docker-compose.yml")))
    for svc in ("trainer", "trainer-gpu"):
        assert f"service policy: (base): service {svc} trains and publishes the tiny char model" in problems, problems
