"""What the code says a deployment must match: read from the project itself, never written down twice.

- the ``rolloutbus`` CLI: its subcommands (read as text from rolloutbus/cli.py, for the tool venv) and
  its real parser (``rolloutbus.cli.build_parser()``);
- the settings: every subclass of ``foundation.config.CommonSettings``, the ``ROLLOUTBUS_*`` names they
  and the code read, and the settings a process would build from its flags and environment;
- what each process serves (host and port settings, GET routes), the Kafka topics and groups it uses
  (from the code's own names: ``foundation.config.Topics``, the stream worker's faust app), where it
  spools, and the credential it needs before it listens beyond loopback.

Imports only the standard library at load time (the tool venv reads :func:`rolloutbus_subcommands`);
the project's packages are imported where a fact needs them (the repository root is put on ``sys.path``).
The module paths below are the code's: a file that moves must be renamed here.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import re
import sys
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PACKAGES = ("foundation", "schemas", "producers", "streams", "trainer", "rolloutbus")
PREFIX = "ROLLOUTBUS_"

# subcommand → the settings class its entry reads (module, class)
SETTINGS = {
    "gateway": ("producers.ingest.settings", "GatewaySettings"),
    "proxy": ("producers.ingest.settings", "ProxySettings"),
    "run-agent": ("producers.settings", "RunnerSettings"),
    "process": ("streams.settings", "StreamSettings"),
    "train": ("trainer.settings", "TrainerSettings"),
    "serve": ("trainer.settings", "ServeSettings"),
    "optimize-prompt": ("trainer.settings", "ApoSettings"),
    "store": ("rolloutbus.store.settings", "StoreSettings"),
    "dashboard": ("rolloutbus.dashboard.settings", "DashboardSettings"),
}
# Field-name prefixes a subcommand's flags drop (--port sets gateway_port, --group sets train_group, ...).
FLAG_FIELD_PREFIXES = ("gateway", "proxy", "runner", "streams", "train", "serve", "apo", "store", "dashboard")

# subcommand → (host field, port field, file whose GET routes it serves). The port a Service or probe
# reaches must be the one these fields resolve to, on an address other than loopback.
LISTENERS = {
    "gateway": ("gateway_host", "gateway_port", "producers/ingest/gateway.py"),
    "proxy": ("proxy_host", "proxy_port", "producers/ingest/llm_proxy.py"),
    "serve": ("serve_host", "serve_port", "trainer/serve_http.py"),  # both engines' one route table
    "process": ("streams_metrics_host", "streams_metrics_port", "foundation/health.py"),
    "train": ("train_metrics_host", "train_metrics_port", "foundation/health.py"),
}
# (command, engine) → the file whose GET routes that engine's server answers, where it is not LISTENERS' one.
ENGINE_ROUTES: dict[tuple[str, str], str] = {}  # none today: serve's torch engine and vLLM gate share openai_app
# Processes that write spans through a SpanTransport: its spool is <data dir>/spool
# (producers.transport.SpanTransport.from_settings).
SPOOLERS = {"gateway", "proxy", "run-agent"}
# The resource followers (producers/runner.py ResourceFollower, trainer/resources.py) read rb.resources by
# assignment under a random group id `rolloutbus-resources-<8 hex>`; librdkafka looks up its coordinator.
FOLLOWER_GROUP = "rolloutbus-resources-00000000"

# command: (its listen-host field, its credential field, the variable to set) — the process refuses to
# listen on a non-loopback address without that credential unless --insecure (foundation/exposure.py).
EXPOSED = {
    "gateway": ("gateway_host", "gateway_token", "ROLLOUTBUS_GATEWAY_TOKEN"),
    "proxy": ("proxy_host", "proxy_token", "ROLLOUTBUS_PROXY_TOKEN"),
    "serve": ("serve_host", "serve_token", "ROLLOUTBUS_SERVE_TOKEN"),
    "dashboard": ("dashboard_host", "dashboard_token", "ROLLOUTBUS_DASHBOARD_TOKEN"),
    "store": ("store_host", "store_users", "ROLLOUTBUS_STORE_USERS"),
}
METRICS_TOKEN = "ROLLOUTBUS_METRICS_TOKEN"
# Commands whose health server (foundation/health.py) serves /metrics: with METRICS_TOKEN it answers only
# that bearer token; without it, bound beyond loopback, it answers anyone (the process only logs a WARNING).
METRICS_SERVERS = ("process", "train")


# --------------------------------------------------------------------------- the CLI


def rolloutbus_subcommands(cli: Path = ROOT / "rolloutbus" / "cli.py") -> set[str]:
    """Subcommands of the `rolloutbus` CLI: built-ins (add_parser) and COMPONENTS keys (read as text)."""
    text = cli.read_text()
    names = set(re.findall(r'sub\.add_parser\(\s*"([\w-]+)"', text))
    block = re.search(r"COMPONENTS[^=]*=\s*\{(.*?)\n\}", text, re.S)
    if block:
        names |= set(re.findall(r'^\s*"([\w-]+)"\s*:', block.group(1), re.M))
    return names


@lru_cache(maxsize=1)
def _parser() -> argparse.ArgumentParser:
    from rolloutbus.cli import build_parser

    return build_parser()


def parse(argv: list[str]) -> tuple[argparse.Namespace | None, str | None]:
    """``argv`` parsed by the real ``rolloutbus`` parser: (namespace, None) or (None, its one-line error)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            ns = _parser().parse_args(argv)
    except SystemExit as exc:
        return None, err.getvalue().strip() or f"exit {exc.code}"
    if getattr(ns, "unavailable", None):
        return None, str(ns.unavailable)
    return ns, None


# --------------------------------------------------------------------------- the settings


def _package_files() -> Iterator[Path]:
    for package in PACKAGES:
        yield from (p for p in (ROOT / package).rglob("*.py") if "__pycache__" not in p.parts)


@lru_cache(maxsize=1)
def settings_classes() -> list[type]:
    """Every subclass of CommonSettings the project defines (their modules imported to find them)."""
    from foundation.config import CommonSettings

    for path in _package_files():
        if re.search(r"^class \w+\(\w*Settings\)", path.read_text(errors="replace"), re.M):
            importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
    found, todo = [], [CommonSettings]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


@lru_cache(maxsize=1)
def known_variables() -> frozenset[str]:
    """ROLLOUTBUS_* names that mean something: settings fields and aliases, and literals the code reads."""
    from pydantic import AliasChoices, AliasPath

    names: set[str] = set()
    for cls in settings_classes():
        prefix = str(cls.model_config.get("env_prefix", ""))
        for name, info in cls.model_fields.items():
            names.add((prefix + name).upper())
            for alias in (info.alias, info.validation_alias):
                choices = alias.choices if isinstance(alias, AliasChoices) else [alias]
                for choice in choices:
                    if isinstance(choice, str):
                        names.add(choice.upper())
                    elif isinstance(choice, AliasPath) and isinstance(choice.path[0], str):
                        names.add(choice.path[0].upper())
    for path in _package_files():
        names.update(re.findall(r"""["'](ROLLOUTBUS_[A-Z0-9_]+)["']""", path.read_text(errors="replace")))
    return frozenset(names)


def _settings_class(command: str) -> type:
    from foundation.config import CommonSettings

    module, name = SETTINGS.get(command, ("foundation.config", "CommonSettings"))
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, CommonSettings)
    return cls  # type: ignore[no-any-return]


def settings_for(command: str, ns: argparse.Namespace, env: dict[str, str]) -> Any:
    """The settings the process would read: its flags over its environment over the defaults.

    Built without the validators (``model_construct``: a CA file named here need not exist on this
    machine); values are only coerced to their fields' types.
    """
    from pydantic import TypeAdapter

    cls = _settings_class(command)
    prefix = str(cls.model_config.get("env_prefix", ""))
    values: dict[str, Any] = {}
    for name, info in cls.model_fields.items():
        if (prefix + name).upper() in env:
            values[name] = env[(prefix + name).upper()]
    for dest, value in vars(ns).items():
        if value is None or dest in ("command", "func", "module", "verbose"):
            continue
        for candidate in (dest, *(f"{p}_{dest}" for p in FLAG_FIELD_PREFIXES)):
            if candidate in cls.model_fields:
                values[candidate] = value
                break
    for name, value in list(values.items()):
        try:
            values[name] = TypeAdapter(cls.model_fields[name].annotation).validate_python(value)
        except Exception:  # noqa: BLE001 - left as given: a bad value is the settings' own check
            pass
    return cls.model_construct(**values)


# --------------------------------------------------------------------------- what a process serves and uses


def rendezvous_port(command: str, s: Any) -> int | None:
    """The port of a multi-node trainer's rendezvous (torchrun's c10d store, on the pod its endpoint names), or None."""
    endpoint = getattr(s, "rdzv_endpoint", None)
    if command != "train" or getattr(s, "nnodes", 1) <= 1 or not endpoint or ":" not in endpoint:
        return None
    return int(endpoint.rsplit(":", 1)[1])


def listener(command: str, s: Any) -> tuple[str, int] | None:
    """(host, port) the process serves HTTP on, or None (no server, or turned off with port 0)."""
    if command not in LISTENERS:
        return None
    host_field, port_field, _ = LISTENERS[command]
    if not hasattr(s, port_field):  # this build of the process has no such setting: it serves nothing
        return None
    port = int(getattr(s, port_field))
    return (str(getattr(s, host_field)), port) if port else None


@lru_cache(maxsize=None)
def get_routes(command: str, engine: str = "") -> frozenset[str]:
    """The GET paths the process answers (read from the module that routes them; ``engine``: ``serve --engine``'s)."""
    path = ROOT / ENGINE_ROUTES.get((command, engine), LISTENERS[command][2])
    text = path.read_text() if path.exists() else ""
    return frozenset(re.findall(r'add_get\(\s*"(/[^"]*)"', text) + re.findall(r'path == "(/[^"]*)"', text))


def routes_for(command: str, s: Any) -> frozenset[str]:
    """The GET paths this process answers, with the engine its settings choose (``serve --engine vllm``: the gate's)."""
    return get_routes(command, str(getattr(s, "serve_engine", "") or ""))


def vllm_version() -> str:
    """The vLLM version `make test` installs and runs the worker extension against (trainer/vllm_venv.py)."""
    from trainer.vllm_venv import VLLM_VERSION

    return VLLM_VERSION


def kafka_needs(command: str, s: Any) -> list[tuple[str, str, str]]:
    """(resource type, name, operation) the process needs on Kafka, derived from the code's own names."""
    from foundation.config import Topics

    t = Topics(s.topic_prefix)
    follow = [("topic", t.resources, "Read"), ("group", FOLLOWER_GROUP, "Describe")]
    if command == "gateway":  # spans, late feedback (producers/ingest/feedback_http.py), Agent Lightning's control records
        from producers.ingest.agl.control_log import control_topic

        return [("topic", t.spans, "Write"), ("topic", t.feedback, "Write")] + [
            ("topic", control_topic(s.topic_prefix), op) for op in ("Read", "Write", "Create")]
    if command == "proxy":
        return [("topic", t.spans, "Write")]
    if command == "run-agent":
        return [("topic", t.tasks, "Read"), ("group", s.runner_group, "Read"), ("topic", t.spans, "Write"),
                ("topic", t.dlq, "Write"), *follow]
    if command == "process":
        from streams.app import done_topic_name
        from streams.spans_stage import span_group, state_topic_name

        app_id = s.application_id
        worker = _faust_worker(app_id, t.prefix)
        owned = [done_topic_name(t.prefix), state_topic_name(app_id), *worker.table_changelogs(),
                 worker.app._leader_assignor._leader_topic_name]
        needs = [("topic", name, "Describe") for name in t.all()]  # `process` checks the design's topics exist
        needs += [("topic", t.spans, "Read"), ("topic", t.batches, "Write"), ("topic", t.dlq, "Read"),
                  ("topic", t.dlq, "Write"), ("topic", t.resources, "Read"), ("topic", t.metrics, "Read"),
                  ("topic", t.feedback, "Read"), ("topic", t.feedback, "Create"),  # made by the worker (streams/cli.py)
                  ("topic", t.feedback, "Write")]  # a late reward span's feedback (streams/spans_stage.py)
        needs += [("topic", name, op) for name in owned for op in ("Read", "Write", "Create")]
        # faust's group is its app id; the span stage's, and its restore reader's (streams/spans_stage.py).
        needs += [("group", g, "Read") for g in (worker.app.conf.id, span_group(app_id), f"{span_group(app_id)}-restore")]
        return needs
    if command == "train":
        needs = [("topic", t.batches, "Read"), ("group", s.resolved_group(), "Read"), ("topic", t.resources, "Write"),
                 ("topic", t.metrics, "Write"), ("topic", t.dlq, "Write"), *follow]
        if s.validation_tasks is not None:  # the validation set goes out as mode-test tasks (trainer/loop.py)
            needs.append(("topic", t.tasks, "Write"))
        return needs
    if command == "serve":
        return follow if s.serve_follow else []
    if command == "optimize-prompt":
        return [("topic", t.resources, "Write"), ("topic", t.tasks, "Write"), *follow]
    if command == "tasks":
        return [("topic", t.tasks, "Write")]
    return []


@lru_cache(maxsize=None)
def _faust_worker(app_id: str, prefix: str) -> Any:
    """The stream worker's faust app, built offline, to ask it the names of the topics it creates."""
    from streams.app import Config, Worker

    cfg = Config(app_id=app_id, broker="kafka://127.0.0.1:9", topic_prefix=prefix, partitions=1,
                 datadir=tempfile.mkdtemp(prefix="rolloutbus-validate-"))
    return Worker(cfg, None)  # type: ignore[arg-type]
