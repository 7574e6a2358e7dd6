"""deploy/ ships the analysts' ClickHouse account: it exists where deploy/ runs ClickHouse, it can only read,
and its password comes from a secret (deploy/validate/analyst.py, run by `make validate-deploy`)."""

from __future__ import annotations

import copy
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

import analyst
import commands
import model
from deploy_tools import ROOT
from rolloutbus.store.access import parse_users

DEPLOY = ROOT / "deploy"
USERS_XML = DEPLOY / "clickhouse" / "users.d" / "analyst.xml"


def _compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())


def test_the_compose_server_mounts_a_read_only_analyst_whose_password_is_required() -> None:
    server = _compose()["services"]["clickhouse"]
    assert "./clickhouse/users.d/analyst.xml:/etc/clickhouse-server/users.d/analyst.xml:ro" in server["volumes"]
    assert server["environment"]["CLICKHOUSE_ANALYST_PASSWORD"].startswith("${ANALYST_PASSWORD:?")
    assert analyst.check_compose(_compose(), "docker-compose.yml", DEPLOY) == []


def _server_problems(tmp_path: Path, xml: str, env_value: str | None = None) -> str:
    (tmp_path / "users.d").mkdir(exist_ok=True)
    (tmp_path / "users.d" / "analyst.xml").write_text(xml)
    server = copy.deepcopy(_compose()["services"]["clickhouse"])
    server["volumes"] = ["clickhouse:/var/lib/clickhouse", "./users.d/analyst.xml:/etc/clickhouse-server/users.d/analyst.xml:ro"]
    if env_value is not None:
        server["environment"]["CLICKHOUSE_ANALYST_PASSWORD"] = env_value
    return "\n".join(analyst.check_server_users("service clickhouse", server, tmp_path))


@pytest.mark.parametrize(("edit", "expected"), [
    (lambda x: x.replace("<readonly>2</readonly>", "<readonly>0</readonly>"), "its profile 'analyst' must set readonly to 1 or 2"),
    (lambda x: x.replace("<profile>analyst</profile>", "<profile>default</profile>"), "its profile 'default' must set readonly to 1 or 2"),
    (lambda x: x.replace('<password from_env="CLICKHOUSE_ANALYST_PASSWORD"/>', "<password>hunter2</password>"),
     'give the password as <password from_env="VAR"/>'),
    (lambda x: x.replace("GRANT SELECT ON rolloutbus.*", "GRANT ALL ON rolloutbus.*"), "the analyst's grant 'GRANT ALL ON rolloutbus.*' is more than SELECT"),
    (lambda x: re.sub(r"<users>\s*<analyst>", "<users><analysts>", x).replace("</analyst>\n    </users>", "</analysts>\n    </users>"),
     "the ClickHouse server has no `analyst` user"),
])
def test_a_server_analyst_that_could_write_or_has_a_written_password_is_refused(tmp_path: Path, edit: Any, expected: str) -> None:
    assert _server_problems(tmp_path, USERS_XML.read_text()) == ""
    assert expected in _server_problems(tmp_path, edit(USERS_XML.read_text()))


def test_a_server_analyst_password_that_may_be_empty_is_refused(tmp_path: Path) -> None:
    problems = _server_problems(tmp_path, USERS_XML.read_text(), "${ANALYST_PASSWORD:-}")
    assert "its password variable CLICKHOUSE_ANALYST_PASSWORD must be set from a required variable" in problems


def test_the_local_store_has_the_analyst_at_the_analyst_role() -> None:
    local = model.load_compose(DEPLOY / "compose.local.yml")
    spec = local["services"]["clickhouse"]["environment"]["ROLLOUTBUS_STORE_USERS"]
    users = {u.name: u for u in parse_users(re.sub(r"\$\{[^}]*\}", "pw", spec))}
    assert users["analyst"].role == "analyst" and users["analyst"].readonly
    assert users["rolloutbus"].role == "writer"
    assert analyst.check_compose(local, "compose.local.yml", DEPLOY, base=_compose()) == []
    assert "role 'writer': use `analyst`" in "\n".join(analyst.check_store_users("x", spec.replace("analyst:analyst:", "analyst:writer:")))
    assert "must be a required variable" in "\n".join(analyst.check_store_users("x", spec.replace("${ANALYST_PASSWORD:?set ANALYST_PASSWORD}", "changeme")))
    assert "has no `analyst` user" in "\n".join(analyst.check_store_users("x", spec.split(",")[0]))


@pytest.fixture(scope="module")
def operator_objs(tools: dict[str, str]) -> list[dict[str, Any]]:
    return model.render(model.K8S / "overlays" / "clickhouse-operator", shlex.split(tools["KUSTOMIZE"]))


def _chi(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return next(o for o in objs if o["kind"] == "ClickHouseInstallation")["spec"]["configuration"]


def test_the_operator_overlay_ships_a_read_only_analyst_with_a_secret_password(operator_objs: list[dict[str, Any]]) -> None:
    conf = _chi(operator_objs)
    assert conf["users"]["analyst/k8s_secret_password"] == "rolloutbus/rolloutbus-clickhouse-analyst/password"
    assert conf["profiles"][f"{conf['users']['analyst/profile']}/readonly"] == 2
    assert analyst.check_k8s(operator_objs, "overlays/clickhouse-operator") == []
    assert "analyst" not in "\n".join(commands.check_k8s(operator_objs, "overlays/clickhouse-operator"))


@pytest.mark.parametrize(("edit", "expected"), [
    (lambda u, p: u.pop("analyst/k8s_secret_password") and u.update({"analyst/password": "hunter2"}),
     "the analyst's password must come from a Secret"),
    (lambda u, p: p.update({"analyst/readonly": 0}), "the analyst's profile 'analyst' must set readonly to 1 or 2"),
    (lambda u, p: u.update({"analyst/profile": "rolloutbus"}), "the analyst's profile 'rolloutbus' must set readonly"),
    (lambda u, p: u.update({"analyst/grants/query": ["GRANT SELECT, INSERT ON rolloutbus.*"]}), "is more than SELECT"),
    (lambda u, p: u.update({"analyst/access_management": 1}), "no access management for the analyst"),
    (lambda u, p: [u.pop(k) for k in list(u) if k.startswith("analyst/")], "no `analyst` user"),
])
def test_an_operator_analyst_that_could_write_or_has_a_written_password_is_refused(
        operator_objs: list[dict[str, Any]], edit: Any, expected: str) -> None:
    objs = copy.deepcopy(operator_objs)
    conf = _chi(objs)
    edit(conf["users"], conf["profiles"])
    assert expected in "\n".join(analyst.check_k8s(objs, "overlays/clickhouse-operator"))
