"""deploy/validate/commands.py: what deploy/ starts, checked against the code it runs.

Each test breaks one thing the way a manifest goes wrong (a flag the CLI does not have, a misspelled
variable, an ACL that misses a group the code uses, a spool on the writable layer, a Service port or a
probe nothing serves, no policy server behind the proxy) and asserts the check names it. The first test
is the one `make validate-deploy` runs: the files as they are pass.
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
from deploy_tools import ROOT

COMPOSE = ROOT / "deploy" / "docker-compose.yml"


@pytest.fixture(scope="module")
def rendered(tools: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    """Every kustomization, rendered once: directory (relative to deploy/k8s) → objects."""
    return {str(d.relative_to(model.K8S)): model.render(d, shlex.split(tools["KUSTOMIZE"])) for d in model.kustomizations()}


def _obj(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)


def _container(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return _obj(objs, kind, name)["spec"]["template"]["spec"]["containers"][0]


def _problems(objs: list[dict[str, Any]]) -> str:
    return "\n".join(commands.check_k8s(objs, "base"))


def test_deploy_files_pass(tools: dict[str, str]) -> None:
    assert commands.main(["--kustomize", tools["KUSTOMIZE"]]) == 0


def test_the_real_parser_and_settings_are_what_is_checked() -> None:
    ns, error = facts.parse(["train", "--device", "cuda", "--metrics-host", "0.0.0.0"])
    assert error is None and ns is not None and ns.command == "train"
    assert facts.parse(["train", "--num-nodes", "2"])[1] == "rolloutbus: unrecognized arguments: --num-nodes 2 (see rolloutbus --help)"
    names = facts.known_variables()
    # settings fields of several process kinds, and names the code reads from os.environ itself
    for name in ("ROLLOUTBUS_KAFKA_BOOTSTRAP", "ROLLOUTBUS_RUNNER_GROUP", "ROLLOUTBUS_STREAMS_METRICS_PORT",
                 "ROLLOUTBUS_TRAIN_DEVICE", "ROLLOUTBUS_SERVE_PORT", "ROLLOUTBUS_LLM_PROXY_URL", "ROLLOUTBUS_KAFKA_CACHE"):
        assert name in names
    assert "ROLLOUTBUS_KAFKA_BOOTSTRAPP" not in names and "ROLLOUTBUS_" not in names


def test_compose_bad_flag_and_misspelled_variable_fail(tmp_path: Path) -> None:
    doc = yaml.safe_load(COMPOSE.read_text())
    doc["services"]["trainer"]["command"] = ["train", "--checkpoint-dir", "/checkpoints", "--num-nodes", "2"]
    doc["services"]["gateway"]["environment"] = {**doc["services"]["gateway"]["environment"], "ROLLOUTBUS_GATEWAY_PROT": "4318"}
    path = tmp_path / "docker-compose.yml"
    path.write_text(yaml.safe_dump(doc))
    problems = "\n".join(commands.check_compose(path))
    assert "service trainer: `rolloutbus train --checkpoint-dir /checkpoints --num-nodes 2` does not parse: " \
           "rolloutbus: unrecognized arguments: --num-nodes 2" in problems
    assert "service gateway: ROLLOUTBUS_GATEWAY_PROT is not a setting of any rolloutbus process" in problems
    assert commands.main(["--no-k8s", "--compose", str(path)]) == 1


def test_compose_spool_and_proxy_url(tmp_path: Path) -> None:
    doc = yaml.safe_load(COMPOSE.read_text())
    doc["services"]["proxy"]["volumes"] = []
    runner = doc["services"]["runner"]
    del runner["environment"]["ROLLOUTBUS_LLM_PROXY_URL"]
    runner["environment"]["OPENAI_BASE_URL"] = "http://proxy:8080/v1"
    path = tmp_path / "docker-compose.yml"
    path.write_text(yaml.safe_dump(doc))
    problems = "\n".join(commands.check_compose(path))
    assert "service proxy: its spool /var/lib/rolloutbus/spool is on the container's writable layer" in problems
    assert "service runner: OPENAI_BASE_URL=http://proxy:8080/v1 points at the LLM proxy" in problems
    assert "service runner: sets no ROLLOUTBUS_LLM_PROXY_URL" in problems


def test_k8s_bad_flag_misspelled_variable_and_rayjob_entrypoint(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = copy.deepcopy(rendered["base"])
    _container(objs, "StatefulSet", "rolloutbus-trainer")["args"] += ["--gpus-per-node", "8"]
    _container(objs, "Deployment", "rolloutbus-stream-worker")["env"].append({"name": "ROLLOUTBUS_SINK_BATCH", "value": "100"})
    _obj(objs, "ConfigMap", "rolloutbus-config")["data"]["ROLLOUTBUS_TOPIC_PREFX"] = "rb."
    problems = _problems(objs)
    assert "StatefulSet/rolloutbus-trainer container trainer: `rolloutbus train" in problems
    assert "unrecognized arguments: --gpus-per-node 8" in problems
    assert "container worker: ROLLOUTBUS_SINK_BATCH is not a setting" in problems
    assert "ConfigMap/rolloutbus-config: ROLLOUTBUS_TOPIC_PREFX is not a setting" in problems

    multi = copy.deepcopy(rendered["overlays/fsdp-multinode"])
    assert commands.check_k8s(multi, "fsdp-multinode") == []
    _container(multi, "StatefulSet", "rolloutbus-trainer")["args"] += ["--nodes", "2"]
    assert "unrecognized arguments: --nodes 2" in "\n".join(commands.check_k8s(multi, "fsdp-multinode"))


def test_kafka_user_acls_must_cover_the_groups_and_topics_the_code_uses(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = copy.deepcopy(rendered["base"])
    worker = _obj(objs, "KafkaUser", "rolloutbus-stream-worker")
    # the ACL the issue found: groups prefixed `rolloutbus`, while the workers' groups are rb.streams...
    for acl in worker["spec"]["authorization"]["acls"]:
        if acl["resource"]["type"] == "group":
            acl["resource"]["name"] = "rolloutbus"
    trainer = _obj(objs, "KafkaUser", "rolloutbus-trainer")
    trainer["spec"]["authorization"]["acls"] = [a for a in trainer["spec"]["authorization"]["acls"] if a["resource"].get("name") != "rb.metrics"]
    runner_env = _container(objs, "StatefulSet", "rolloutbus-runner")["env"]
    next(e for e in runner_env if e["name"] == "ROLLOUTBUS_KAFKA_SASL_PASSWORD")["valueFrom"]["secretKeyRef"]["name"] = "rolloutbus"
    problems = _problems(objs)
    for group in ("rb.streams", "rb.streams.spans", "rb.streams.spans-restore"):
        assert f"`rolloutbus process` needs Read on group {group}, which KafkaUser rolloutbus-stream-worker's ACLs do not allow" in problems
    assert "`rolloutbus train` needs Write on topic rb.metrics, which KafkaUser rolloutbus-trainer's ACLs do not allow" in problems
    assert "container runner: ROLLOUTBUS_KAFKA_SASL_PASSWORD must come from Secret 'rolloutbus-runner'" in problems


def test_a_trainer_given_a_validation_set_needs_write_on_the_tasks_topic(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = copy.deepcopy(rendered["base"])
    assert "rb.tasks" not in _problems(objs)
    _container(objs, "StatefulSet", "rolloutbus-trainer")["args"] += ["--validation-tasks", "/data/validation.jsonl"]
    assert "`rolloutbus train` needs Write on topic rb.tasks, which KafkaUser rolloutbus-trainer's ACLs do not allow" in _problems(objs)
    trainer = _obj(objs, "KafkaUser", "rolloutbus-trainer")
    trainer["spec"]["authorization"]["acls"].append({"resource": {"type": "topic", "name": "rb.tasks", "patternType": "literal"},
                                                      "operations": ["Write"]})
    assert "rb.tasks" not in _problems(objs)


def test_the_acls_follow_the_app_id_and_groups_the_processes_are_given(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = copy.deepcopy(rendered["base"])
    _container(objs, "Deployment", "rolloutbus-stream-worker")["env"].append({"name": "ROLLOUTBUS_APP_ID", "value": "team-a.streams"})
    _container(objs, "StatefulSet", "rolloutbus-runner")["args"] += ["--group", "team-a-runners"]
    problems = _problems(objs)
    assert "needs Read on group team-a.streams.spans" in problems
    assert "needs Create on topic team-a.streams-group-state-changelog" in problems
    assert "needs Create on topic team-a.streams-__assignor-__leader" in problems
    assert "`rolloutbus run-agent` needs Read on group team-a-runners" in problems


def test_spool_must_be_on_a_persistent_volume_of_its_own(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = copy.deepcopy(rendered["base"])
    gateway = _obj(objs, "StatefulSet", "rolloutbus-gateway")
    del gateway["spec"]["volumeClaimTemplates"]
    gateway["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] = [
        m for m in gateway["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] if m["name"] != "data"]
    proxy = _obj(objs, "StatefulSet", "rolloutbus-proxy")
    proxy["spec"]["template"]["spec"]["volumes"].append({"name": "data", "emptyDir": {}})
    del proxy["spec"]["volumeClaimTemplates"]
    problems = _problems(objs)
    assert "StatefulSet/rolloutbus-gateway container gateway: its spool /var/lib/rolloutbus/spool is on the container's writable layer" in problems
    assert "StatefulSet/rolloutbus-proxy container proxy: its spool /var/lib/rolloutbus/spool is on volume 'data' (emptyDir)" in problems


def test_service_ports_and_probes_must_be_served(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = copy.deepcopy(rendered["base"])
    trainer = _container(objs, "StatefulSet", "rolloutbus-trainer")
    trainer["args"] = [a for a in trainer["args"] if a not in ("--metrics-host", "0.0.0.0")]  # default 127.0.0.1
    svc = _obj(objs, "Service", "rolloutbus-gateway")
    svc["spec"]["ports"][0]["targetPort"] = 9999
    worker = _container(objs, "Deployment", "rolloutbus-stream-worker")
    del worker["livenessProbe"]
    worker["readinessProbe"]["httpGet"]["path"] = "/ready"
    proxy = _container(objs, "StatefulSet", "rolloutbus-proxy")
    proxy["readinessProbe"] = {"tcpSocket": {"port": "http"}}
    problems = _problems(objs)
    assert "Service/rolloutbus-trainer port metrics: `rolloutbus train` binds 127.0.0.1, which nothing outside the pod reaches" in problems
    assert "Service/rolloutbus-gateway port otlp-http: reaches port 9999, but `rolloutbus gateway` serves 4318" in problems
    assert "container worker: no livenessProbe" in problems
    assert "container worker: readinessProbe: path /ready is not a GET route of `rolloutbus process`" in problems
    assert "container proxy: readinessProbe is not an HTTP probe" in problems


def test_the_proxy_needs_its_policy_server_and_runners_its_url(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = [o for o in copy.deepcopy(rendered["base"]) if o["metadata"]["name"] != "rolloutbus-policy"]
    runner = _container(objs, "StatefulSet", "rolloutbus-runner")
    runner["env"] = [e for e in runner["env"] if e["name"] != "ROLLOUTBUS_LLM_PROXY_URL"] + [
        {"name": "OPENAI_BASE_URL", "value": "http://rolloutbus-proxy:8080/v1"}]
    problems = _problems(objs)
    assert "the proxy forwards to http://rolloutbus-policy:8000/v1, but there is no Service 'rolloutbus-policy'" in problems
    assert "OPENAI_BASE_URL=http://rolloutbus-proxy:8080/v1 points at the LLM proxy" in problems
    assert "container runner: sets no ROLLOUTBUS_LLM_PROXY_URL" in problems


def test_a_server_on_an_open_address_needs_its_token(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """The policy server, gateway and proxy listen on 0.0.0.0: without their tokens they refuse to start."""
    objs = copy.deepcopy(rendered["base"])
    assert "refuses to start" not in _problems(objs)
    for kind, name, variable in [("Deployment", "rolloutbus-policy", "ROLLOUTBUS_SERVE_TOKEN"),
                                 ("StatefulSet", "rolloutbus-gateway", "ROLLOUTBUS_GATEWAY_TOKEN")]:
        c = _container(objs, kind, name)
        c["env"] = [e for e in c["env"] if e["name"] != variable]
    problems = _problems(objs)
    assert "`serve` listens on 0.0.0.0 without ROLLOUTBUS_SERVE_TOKEN" in problems
    assert "`gateway` listens on 0.0.0.0 without ROLLOUTBUS_GATEWAY_TOKEN" in problems
    _container(objs, "Deployment", "rolloutbus-policy")["args"].append("--insecure")
    assert "ROLLOUTBUS_SERVE_TOKEN" not in _problems(objs)
