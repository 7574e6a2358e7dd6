"""deploy/compose.gpu-vllm.yml layered on docker-compose.yml, as compose merges them (deploy/containers/compose.py,
the reader `make test-deploy` runs the base with): pure, no containers, no GPU.

The merged `policy` service is the vLLM one (command, image from the `policy-vllm` target, a GPU, the longer start
period), the proxy still reaches it by the same name, and both trainers start from BASE_MODEL_DIR.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "deploy" / "containers"))

from compose import ComposeError, Project  # noqa: E402

FILES = [REPO / "deploy" / "docker-compose.yml", REPO / "deploy" / "compose.gpu-vllm.yml"]
ENV = {"CLICKHOUSE_PASSWORD": "pw", "ANALYST_PASSWORD": "ap", "POLICY_TOKEN": "pt", "PROXY_TOKEN": "xt", "GATEWAY_TOKEN": "gt",
       "BASE_MODEL_DIR": "/srv/models/smollm2"}


def test_the_policy_service_becomes_the_vllm_one_and_the_trainers_start_from_the_base_model() -> None:
    p = Project.load(FILES, env=ENV, profiles=("gpu",))
    policy = p.services["policy"]
    assert policy.command() == ["serve", "--engine", "vllm", "--host", "0.0.0.0", "--port", "8000"]
    assert policy.image == "rolloutbus-policy-vllm:0.1.0"
    assert policy.spec["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile", "target": "policy-vllm"}
    # POLICY_GPUS interpolated to its default (a string, as compose interpolates), one NVIDIA GPU
    assert policy.spec["deploy"]["resources"]["reservations"]["devices"] == [{"driver": "nvidia", "count": "1", "capabilities": ["gpu"]}]
    assert policy.spec["shm_size"] == "8gb"
    assert policy.healthcheck is not None and policy.healthcheck["start_period"] == "600s"
    assert policy.environment["ROLLOUTBUS_SERVE_TOKEN"] == "pt"  # the base's environment is kept
    assert "checkpoints:/checkpoints:ro" in policy.spec["volumes"]
    assert "http://policy:8000/v1" in p.services["proxy"].command()
    for name in ("trainer", "trainer-gpu"):
        t = p.services[name]
        assert t.command()[-2:] == ["--model", "/models/base"]
        assert {"checkpoints:/checkpoints", "/srv/models/smollm2:/models/base:ro"} <= set(t.spec["volumes"])
    assert "--device" in p.services["trainer-gpu"].command()


def test_without_a_base_model_dir_it_names_the_variable() -> None:
    with pytest.raises(ComposeError, match="set BASE_MODEL_DIR to a Hugging Face model directory"):
        Project.load(FILES, env={k: v for k, v in ENV.items() if k != "BASE_MODEL_DIR"})
