"""deploy/prometheus: the rules load in Prometheus 2.42's promtool, every alert has a promtool unit test
that makes it fire, and every metric the rules and the Grafana dashboard read is one the processes
really export (read from their own metric registries, not from a list kept by hand)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
PROM = ROOT / "deploy" / "prometheus"
RULES = PROM / "rolloutbus-rules.yml"
RULE_TESTS = PROM / "tests" / "rolloutbus-rules.test.yml"
DASHBOARD = PROM / "grafana" / "rolloutbus-dashboard.json"
# Series Prometheus makes itself for every target.
SYNTHETIC = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}


@pytest.fixture(scope="session")
def promtool() -> str:
    """promtool from Debian's prometheus package, installed by deploy/prometheus/install-tools.sh if missing."""
    proc = subprocess.run(["bash", str(PROM / "install-tools.sh")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr).strip().splitlines()[-1:]
    return "promtool"


def test_promtool_checks_the_rules_and_the_scrape_config(promtool: str) -> None:
    for args in (["check", "rules", str(RULES)], ["check", "config", str(PROM / "prometheus.yml")]):
        r = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr


def test_promtool_unit_tests_of_every_alert_pass(promtool: str) -> None:
    r = subprocess.run([promtool, "test", "rules", RULE_TESTS.name], cwd=RULE_TESTS.parent, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def _rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def test_every_alert_is_made_to_fire_by_a_unit_test() -> None:
    alerts = {r["alert"] for r in _rules() if "alert" in r}
    fired = {case["alertname"] for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
             for case in test.get("alert_rule_test", []) if case.get("exp_alerts")}
    assert alerts == fired, f"alerts without a firing test: {sorted(alerts - fired)}; tests of no alert: {sorted(fired - alerts)}"
    for rule in _rules():
        if "alert" in rule:
            assert rule["labels"]["severity"] in ("warning", "critical") and rule["annotations"]["summary"], rule["alert"]


# --------------------------------------------------------------------------- metric names

_FUNCTION_OR_KEYWORD = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset", "inf", "nan",
}


def metric_names(expr: str) -> set[str]:
    """The metric (and recording rule) names a PromQL expression reads."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', "", expr)        # strings
    text = re.sub(r"\{[^}]*\}", " ", text)                                     # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)                                    # ranges, subqueries
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)  # label lists
    text = re.sub(r"\boffset\s+-?\w+", " ", text)                              # offset 5m
    text = re.sub(r"(?<![\w:])\d+(\.\d+)?([eE][+-]?\d+)?", " ", text)         # numbers
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        rest = text[m.end():].lstrip()
        if rest.startswith("(") or m.group(0) in _FUNCTION_OR_KEYWORD:
            continue  # a function or an operator
        names.add(m.group(0))
    return names


def test_metric_names_are_read_from_promql() -> None:
    expr = ('histogram_quantile(0.95, sum by (le) (rate(a_bucket{code=~"5.."}[5m]))) / on (instance) '
            'clamp_min(b:rec, 1e-9) > 0.05 and time() - c_seconds offset 5m')
    assert metric_names(expr) == {"a_bucket", "b:rec", "c_seconds"}


def _series_names(registry: Any) -> set[str]:
    """Every series name a registry can serve, also for labelled metrics that have no child yet."""
    suffixes = {"counter": ["_total", "_created"], "gauge": [""], "histogram": ["_bucket", "_sum", "_count", "_created"],
                "summary": ["", "_sum", "_count", "_created"], "info": ["_info"], "untyped": [""], "unknown": [""]}
    names = set()
    for family in registry.collect():
        names.update(family.name + s for s in suffixes.get(family.type, [""]))
        names.update(sample.name for sample in family.samples)
    return names


def exported_metrics() -> dict[str, set[str]]:
    """What each process kind exports, from its own registry."""
    from prometheus_client import REGISTRY

    import streams.app  # noqa: F401 - registers the worker's metrics on the default registry
    import streams.health  # noqa: F401
    import streams.spans_stage  # noqa: F401
    from producers.ingest.gateway import Gateway
    from trainer.health import TrainerHealth

    class _Transport:  # what the gateway's gauges ask of its span transport
        kafka_up = True

        def stats(self) -> dict[str, Any]:
            return {"spool_pending": 0}

    spec = importlib.util.spec_from_file_location("kafka_lag_exporter", PROM / "kafka_lag_exporter.py")
    assert spec and spec.loader
    lag = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lag)
    return {
        "rolloutbus-streams": _series_names(REGISTRY),
        "rolloutbus-gateway": _series_names(Gateway(_Transport()).registry),  # type: ignore[arg-type]
        "rolloutbus-trainer": _series_names(TrainerHealth().registry),
        "rolloutbus-kafka": _series_names(lag.registry_for(lag.LagCollector({}, "rb."))),
    }


def _dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


def test_every_metric_in_the_rules_and_the_dashboard_is_exported() -> None:
    exported = set().union(*exported_metrics().values()) | SYNTHETIC
    recorded = {r["record"] for r in _rules() if "record" in r}
    used: dict[str, set[str]] = {}
    for where, exprs in (("rules", [r["expr"] for r in _rules()]), ("dashboard", _dashboard_exprs())):
        for expr in exprs:
            for name in metric_names(expr):
                used.setdefault(name, set()).add(where)
    unknown = {n: sorted(w) for n, w in used.items() if n not in exported and n not in recorded}
    assert not unknown, f"metrics no process exports: {unknown}"
    # The dashboard shows each process kind, and the rules cover each.
    for job, names in exported_metrics().items():
        assert names & set(used), f"nothing of {job} is used"


def test_the_dashboard_is_grafana_json_over_a_prometheus_datasource() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["schemaVersion"] >= 36 and dash["templating"]["list"][0]["type"] == "datasource"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dash["panels"]:
        if panel["type"] != "row":
            assert panel["targets"] and panel["datasource"]["uid"] == "${datasource}", panel["title"]


def test_the_rules_name_the_jobs_of_the_scrape_config() -> None:
    config = yaml.safe_load((PROM / "prometheus.yml").read_text())
    jobs = {c["job_name"] for c in config["scrape_configs"]}
    assert jobs == set(exported_metrics()), jobs
    assert config["rule_files"] == ["rolloutbus-rules.yml"]


def _k8s_pod(path: Path) -> dict[str, Any]:
    """The pod template of the workload in a deploy/k8s/base file."""
    doc = next(d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] in ("Deployment", "StatefulSet"))
    return doc["spec"]["template"]


def test_the_kubernetes_scrape_config_sends_each_pod_the_token_it_asks_for(promtool: str, tmp_path: Path) -> None:
    """prometheus-k8s.yml: the same jobs; each keeps the pods and the port that serve /metrics, and sends the
    bearer token those pods read from the Secret rolloutbus-http (same key)."""
    text = (PROM / "prometheus-k8s.yml").read_text()
    config = yaml.safe_load(text)
    jobs = {c["job_name"]: c for c in config["scrape_configs"]}
    assert set(jobs) == set(exported_metrics()) and config["rule_files"] == ["rolloutbus-rules.yml"]
    base = ROOT / "deploy" / "k8s" / "base"
    mount = "/etc/prometheus/secrets/rolloutbus-http/"
    for job, file, variable in [("rolloutbus-streams", "stream-workers.yaml", "ROLLOUTBUS_METRICS_TOKEN"),
                                ("rolloutbus-trainer", "trainer.yaml", "ROLLOUTBUS_METRICS_TOKEN"),
                                ("rolloutbus-gateway", "gateway.yaml", "ROLLOUTBUS_GATEWAY_TOKEN")]:
        pod = _k8s_pod(base / file)
        container = pod["spec"]["containers"][0]
        ref = next(e for e in container["env"] if e["name"] == variable)["valueFrom"]["secretKeyRef"]
        assert ref["name"] == "rolloutbus-http"
        assert jobs[job]["authorization"]["credentials_file"] == mount + ref["key"], job
        keep = next(r for r in jobs[job]["relabel_configs"] if r.get("action") == "keep")
        name, port = keep["regex"].split(";")
        assert pod["metadata"]["labels"]["app.kubernetes.io/name"] == name, job
        assert port in [p["name"] for p in container["ports"]], job
    # Debian's promtool is built without Kubernetes discovery: the rest (authorization, relabeling) is
    # checked with static targets in its place and the token files where the Secret would be mounted.
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    for key in ("metrics-token", "gateway-token"):
        (secrets / key).write_text("token\n")
    for c in config["scrape_configs"]:
        assert c.pop("kubernetes_sd_configs")[0]["namespaces"] == {"names": ["rolloutbus"]}
        c["static_configs"] = [{"targets": ["127.0.0.1:9"]}]
        if "authorization" in c:
            c["authorization"]["credentials_file"] = c["authorization"]["credentials_file"].replace(mount, f"{secrets}/")
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    (tmp_path / "rolloutbus-rules.yml").write_text(RULES.read_text())
    r = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
