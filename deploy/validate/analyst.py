"""The analysts' ClickHouse account that deploy/ ships: it exists, it can only read, its password is a secret.

Where deploy/ runs ClickHouse, a user named ``analyst`` must be there besides the writer:

- docker-compose.yml's ClickHouse server: a ``users.d`` file mounted into the server defines ``analyst``
  with a profile of ``readonly`` 1 or 2, grants of ``SELECT`` only and no access management, and a
  ``<password from_env="VAR"/>`` whose ``VAR`` the service sets from a required variable
  (``${NAME:?...}``: compose refuses to start without it, so the password is never empty or written down);
- compose.local.yml's ``rolloutbus store``: ``ROLLOUTBUS_STORE_USERS`` lists ``analyst`` with the
  ``analyst`` role (read-only in the store whatever a request asks), its password a required variable;
- a ClickHouseInstallation (k8s, the operator overlay): ``analyst/k8s_secret_password`` (a Secret, never
  ``analyst/password``), ``analyst/profile`` naming a profile with ``readonly`` 1 or 2, SELECT-only grants.

Pure functions over loaded documents; rules.py registers them (rule 10) for `make validate-deploy`.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from model import environment, volume_mounts

ANALYST = "analyst"
# ${NAME:?message} or ${NAME?message}: compose stops when NAME is unset (and, with ':', when empty).
REQUIRED = re.compile(r"^\$\{[A-Za-z_][A-Za-z0-9_]*:\?[^}]*\}$")
SELECT_ONLY = re.compile(r"^\s*GRANT\s+SELECT\s+ON\s+\S+\s*$", re.IGNORECASE)


def _readonly(value: Any) -> bool:
    return str(value).strip() in ("1", "2")


def _grants_problems(where: str, grants: list[str]) -> list[str]:
    if not grants:
        return [f"{where}: the analyst has no grants (give `GRANT SELECT ON rolloutbus.*`)"]
    return [f"{where}: the analyst's grant {g!r} is more than SELECT" for g in grants if not SELECT_ONLY.match(g)]


def _is_server(service: dict[str, Any]) -> bool:
    return "clickhouse-server" in str(service.get("image", ""))


def _users_files(service: dict[str, Any], compose_dir: Path) -> list[Path]:
    """Host files the service mounts into the server's users.d (bind mounts, short or long syntax)."""
    return [(compose_dir / source).resolve() for source, target in volume_mounts(service, interpolate=False)
            if "/users.d/" in target and source.startswith((".", "/"))]


def check_server_users(where: str, service: dict[str, Any], compose_dir: Path) -> list[str]:
    """A ClickHouse server service of a compose file: its users.d defines a read-only analyst with a secret password."""
    files = _users_files(service, compose_dir)
    for path in files:
        if not path.is_file():
            return [f"{where}: mounts {path}, which does not exist"]
        root = ET.parse(path).getroot()
        user = root.find(f"users/{ANALYST}")
        if user is None:
            continue
        what = f"{where}: {path.name}: user {ANALYST}"
        problems: list[str] = []
        password = [p for p in user if p.tag.startswith("password")]
        env = environment(service, interpolate=False)
        if len(password) != 1 or not password[0].get("from_env") or (password[0].text or "").strip():
            problems.append(f"{what}: give the password as <password from_env=\"VAR\"/> (nothing written in the file)")
        elif not REQUIRED.match(env.get(password[0].get("from_env", ""), "")):
            var = password[0].get("from_env")
            problems.append(f"{what}: its password variable {var} must be set from a required variable "
                            f"({var}: ${{ANALYST_PASSWORD:?...}}), got {env.get(var, 'nothing')!r}")
        profile_name = (user.findtext("profile") or "default").strip()
        profile = next((p for f in files for p in ET.parse(f).getroot().findall(f"profiles/{profile_name}")), None)
        if profile is None or not _readonly(profile.findtext("readonly")):
            problems.append(f"{what}: its profile {profile_name!r} must set readonly to 1 or 2")
        if (user.findtext("access_management") or "0").strip() not in ("", "0"):
            problems.append(f"{what}: no access management for the analyst")
        problems += _grants_problems(what, [q.text or "" for q in user.findall("grants/query")])
        return problems
    return [f"{where}: the ClickHouse server has no `{ANALYST}` user: mount a users.d file that defines it "
            f"(deploy/clickhouse/users.d/analyst.xml)"]


def check_store_users(where: str, spec: str) -> list[str]:
    """``ROLLOUTBUS_STORE_USERS`` as written in a compose file: an analyst-role ``analyst`` with a required password."""
    entries = {e.split(":", 1)[0].strip(): (e.split(":", 2) + ["", ""])[1:3] for e in spec.split(",") if e.strip()}
    if ANALYST not in entries:
        return [f"{where}: ROLLOUTBUS_STORE_USERS has no `{ANALYST}` user (add {ANALYST}:analyst:${{ANALYST_PASSWORD:?...}})"]
    role, password = entries[ANALYST]
    problems = []
    if role != "analyst":
        problems.append(f"{where}: ROLLOUTBUS_STORE_USERS gives {ANALYST} the role {role!r}: use `analyst` (read-only)")
    if not REQUIRED.match(password):
        problems.append(f"{where}: the {ANALYST} password in ROLLOUTBUS_STORE_USERS must be a required variable (${{ANALYST_PASSWORD:?...}})")
    return problems


def check_compose(doc: dict[str, Any], name: str, compose_dir: Path, base: dict[str, Any] | None = None) -> list[str]:
    """Every ClickHouse of a compose file (a server, or the store where an override runs it) has the analyst."""
    problems = []
    for svc, s in (doc.get("services") or {}).items():
        where = f"{name}: service {svc}"
        command = s.get("command") or []
        store = (command.split() if isinstance(command, str) else [str(a) for a in command])[:1] == ["store"]
        users = environment(s, interpolate=False).get("ROLLOUTBUS_STORE_USERS")
        if store and users is not None:
            problems += check_store_users(where, users)
        elif store:
            problems.append(f"{where}: the store sets no ROLLOUTBUS_STORE_USERS (a writer and the read-only {ANALYST})")
        elif _is_server(s) and base is None:
            problems += check_server_users(where, s, compose_dir)
    return problems


def check_clickhouse_installation(obj: dict[str, Any], where: str) -> list[str]:
    """A ClickHouseInstallation (Altinity operator): the analyst's password from a Secret, a read-only profile."""
    conf = obj.get("spec", {}).get("configuration", {})
    users, profiles = conf.get("users") or {}, conf.get("profiles") or {}
    mine = {k.split("/", 1)[1]: v for k, v in users.items() if k.startswith(f"{ANALYST}/")}
    what = f"{where}: ClickHouseInstallation/{obj['metadata']['name']}"
    if not mine:
        return [f"{what}: no `{ANALYST}` user (analyst/k8s_secret_password, analyst/profile with readonly, "
                f"analyst/grants/query: SELECT)"]
    problems = []
    if not any(k in mine for k in ("k8s_secret_password", "k8s_secret_password_sha256_hex", "k8s_secret_password_double_sha1_hex")):
        problems.append(f"{what}: the analyst's password must come from a Secret (analyst/k8s_secret_password: <namespace>/<secret>/<key>)")
    literal = [k for k in mine if k in ("password", "password_sha256_hex", "password_double_sha1_hex")]
    if literal:
        problems.append(f"{what}: analyst/{literal[0]} writes the password (or its hash) into the manifest: use a Secret")
    profile = str(mine.get("profile", "default"))
    if not _readonly(profiles.get(f"{profile}/readonly", "0")):
        problems.append(f"{what}: the analyst's profile {profile!r} must set readonly to 1 or 2 ({profile}/readonly: 2)")
    if str(mine.get("access_management", "0")) not in ("0", ""):
        problems.append(f"{what}: no access management for the analyst")
    grants = mine.get("grants/query") or []
    problems += _grants_problems(what, [grants] if isinstance(grants, str) else [str(g) for g in grants])
    return problems


def check_k8s(objs: list[dict[str, Any]], name: str) -> list[str]:
    """Every ClickHouse that a kustomization runs has the analyst (a managed service is the operator's to set up)."""
    return [p for o in objs if o.get("kind") == "ClickHouseInstallation" for p in check_clickhouse_installation(o, name)]
