"""Rules on what deploy/ wires each process to, checked against the code it runs (the project's Python):

1. every command line parses with the real ``rolloutbus`` parser (compose services, k8s containers, the
   RayJob entrypoint; ``$(VAR)`` and ``${VAR:-default}`` expanded first);
2. every ``ROLLOUTBUS_*`` variable set (environment, ConfigMap data) is a setting or a name the code reads;
3. k8s: a container that talks to Kafka connects as a KafkaUser whose Secret holds its password and whose
   ACLs allow every topic and group its process uses;
4. k8s: every Service port and HTTP probe reaches a port the selected process serves, beyond loopback, a
   probe's path is a GET route of it, and the long-running servers have readiness and liveness probes;
5. the producers' spool (``<data dir>/spool``) is on a persistent volume;
6. the proxy's upstream names a Service / compose service that exists (or a host outside);
7. runners get the proxy's base URL as ``ROLLOUTBUS_LLM_PROXY_URL`` (never an ``OPENAI_BASE_URL`` at it).
"""

from __future__ import annotations

import argparse
import ipaddress
import shlex
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlparse

from facts import LISTENERS, PREFIX, SPOOLERS, kafka_needs, known_variables, listener, rendezvous_port, routes_for
from model import LONG_RUNNING, ComposeFile, Container, Kustomization, environment, under, volume_mounts
from processes import Processes


def loopback(host: str) -> bool:
    """Whether ``host`` is reached only from inside its own pod / container."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# --------------------------------------------------------------------------- rules 1 and 2


def commands_parse(target: ComposeFile | Kustomization, procs: Processes) -> list[str]:
    """Rule 1: every command parses."""
    return [f"{c.where}: `rolloutbus {shlex.join(c.argv)}` does not parse: {error}" for c, _, error in procs.parsed if error]


def _unknown(names: list[str]) -> list[str]:
    return [n for n in sorted(names) if n.startswith(PREFIX) and n not in known_variables()]


def compose_variables(f: ComposeFile, _: Processes) -> list[str]:
    """Rule 2, compose: each service's ROLLOUTBUS_* names."""
    return [f"{f.name}: service {svc}: {n} is not a setting of any rolloutbus process"
            for svc, s in f.services.items() for n in _unknown(list(environment(s)))]


def k8s_variables(k: Kustomization, _: Processes) -> list[str]:
    """Rule 2, k8s: ConfigMap keys, and each rolloutbus container's environment."""
    problems = [f"{k.name}: ConfigMap/{name}: {n} is not a setting of any rolloutbus process"
                for name, data in k.config_maps.items() for n in _unknown(list(data))]
    return problems + [f"{c.where}: {n} is not a setting of any rolloutbus process (no settings field, alias or "
                       f"os.environ read has that name)" for c in k.containers for n in _unknown(list(c.env))]


# --------------------------------------------------------------------------- rule 3


def kafka_users(k: Kustomization, procs: Processes) -> list[str]:
    """Rule 3: each container's KafkaUser exists, its Secret is that user's, its ACLs cover the process."""
    from foundation.kafka_admin import acl_allows, kafka_user_acls

    problems = []
    users = k.named("KafkaUser")
    for c, ns, s in procs:
        needs = kafka_needs(ns.command, s)
        if not needs or not str(c.env.get("ROLLOUTBUS_KAFKA_SECURITY_PROTOCOL", "")).upper().startswith("SASL"):
            continue
        user = c.env.get("ROLLOUTBUS_KAFKA_SASL_USERNAME")
        if not user:
            problems.append(f"{c.where}: connects with SASL but sets no ROLLOUTBUS_KAFKA_SASL_USERNAME (its KafkaUser)")
            continue
        if user not in users:
            problems.append(f"{c.where}: Kafka user {user!r} has no KafkaUser (have {sorted(users)})")
            continue
        secret = next((e["valueFrom"]["secretKeyRef"] for e in c.spec.get("env", []) or []
                       if e["name"] == "ROLLOUTBUS_KAFKA_SASL_PASSWORD" and (e.get("valueFrom") or {}).get("secretKeyRef")), None)
        if secret is None or secret.get("name") != user:
            problems.append(f"{c.where}: ROLLOUTBUS_KAFKA_SASL_PASSWORD must come from Secret {user!r} (Strimzi's, of KafkaUser {user}), "
                            f"not {secret.get('name') if secret else 'nowhere'}")
        acls = kafka_user_acls(users[user])
        problems += [f"{c.where}: `rolloutbus {ns.command}` needs {op} on {kind} {name}, which KafkaUser {user}'s ACLs do not allow"
                     for kind, name, op in needs if not acl_allows(acls, kind, name, op)]
    return problems


# --------------------------------------------------------------------------- rule 4


def _port_of(c: dict[str, Any], port: Any) -> int | None:
    """A container port by name or number (None: the container declares no such port)."""
    for p in c.get("ports", []) or []:
        if port in (p.get("name"), p.get("containerPort")):
            return int(p["containerPort"])
    return int(port) if isinstance(port, int) else None


def _served(ns: argparse.Namespace, s: Any, port: int | None, what: str) -> list[str]:
    served = listener(ns.command, s)
    if served is None:
        return [f"{what}: `rolloutbus {ns.command}` serves no HTTP port (or has it turned off)"]
    host, number = served
    problems = []
    if port != number:
        problems.append(f"{what}: reaches port {port}, but `rolloutbus {ns.command}` serves {number}")
    if loopback(host):
        problems.append(f"{what}: `rolloutbus {ns.command}` binds {host}, which nothing outside the pod reaches: "
                        f"set {LISTENERS[ns.command][0]} to 0.0.0.0")
    return problems


def probes(k: Kustomization, procs: Processes) -> list[str]:
    """Rule 4, probes: HTTP readiness and liveness on a served port and a real GET route."""
    problems = []
    for c, ns, s in procs:
        if c.kind == "RayJob":
            continue
        for probe_name in ("readinessProbe", "livenessProbe", "startupProbe"):
            probe = c.spec.get(probe_name)
            if probe is None:
                if probe_name != "startupProbe" and ns.command in LISTENERS and c.kind in LONG_RUNNING:
                    problems.append(f"{c.where}: no {probe_name} (use an HTTP probe on one of {sorted(routes_for(ns.command, s))})")
                continue
            if "httpGet" not in probe:
                problems.append(f"{c.where}: {probe_name} is not an HTTP probe; `rolloutbus {ns.command}` answers "
                                f"{sorted(routes_for(ns.command, s)) if ns.command in LISTENERS else 'no HTTP'}")
                continue
            get = probe["httpGet"]
            what = f"{c.where}: {probe_name}"
            problems += _served(ns, s, _port_of(c.spec, get.get("port")), what)
            if ns.command in LISTENERS and get.get("path", "/") not in routes_for(ns.command, s):
                problems.append(f"{what}: path {get.get('path')} is not a GET route of `rolloutbus {ns.command}` ({sorted(routes_for(ns.command, s))})")
    return problems


def service_ports(k: Kustomization, procs: Processes) -> list[str]:
    """Rule 4, Services: each port reaches a port the selected rolloutbus process serves."""
    problems = []
    for svc in k.of_kind("Service"):
        for c, ns, s in (p for p in procs if k.selects(svc, p.container)):
            for p in svc["spec"].get("ports", []):
                target = p.get("targetPort", p["port"])
                port = _port_of(c.spec, target)
                what = f"{k.name}: Service/{svc['metadata']['name']} port {p.get('name', p['port'])}"
                if port is None:
                    problems.append(f"{what}: targetPort {target!r} is no port of {c.where.split(': ', 1)[1]}")
                    continue
                if port == rendezvous_port(ns.command, s):  # torchrun's rendezvous, not an HTTP server
                    continue
                problems += _served(ns, s, port, what)
    return problems


# --------------------------------------------------------------------------- rule 5


def _spool(c: Container, ns: argparse.Namespace) -> str | None:
    data_dir = getattr(ns, "data_dir", None) or c.env.get("ROLLOUTBUS_DATA_DIR")
    return str(PurePosixPath(data_dir) / "spool") if data_dir else None


def k8s_spools(k: Kustomization, procs: Processes) -> list[str]:
    """Rule 5 (k8s): <data dir>/spool of a span producer sits on a PVC (a template, or RWX when shared)."""
    problems = []
    for c, ns, _ in procs:
        if c.kind == "RayJob" or ns.command not in SPOOLERS:
            continue
        spool = _spool(c, ns)
        if spool is None:
            problems.append(f"{c.where}: {ns.command} spools spans under <data dir>/spool: set ROLLOUTBUS_DATA_DIR to a persistent volume")
            continue
        mounts = [m for m in c.spec.get("volumeMounts", []) or [] if under(spool, m["mountPath"])]
        if not mounts:
            problems.append(f"{c.where}: its spool {spool} is on the container's writable layer (lost on restart): mount a "
                            f"PersistentVolumeClaim there (StatefulSet volumeClaimTemplates)")
            continue
        mount_name = max(mounts, key=lambda m: len(m["mountPath"]))["name"]
        backing = _volumes(c).get(mount_name, "?")
        if backing == "template":
            continue
        if not backing.startswith("pvc:"):
            problems.append(f"{c.where}: its spool {spool} is on volume {mount_name!r} ({backing}), gone with the pod: use a PersistentVolumeClaim")
            continue
        claim = k.named("PersistentVolumeClaim").get(backing[4:])
        replicas = c.obj.get("spec", {}).get("replicas", 1)
        shared = replicas > 1 or any(o["spec"]["scaleTargetRef"]["name"] == c.obj["metadata"]["name"] for o in k.of_kind("HorizontalPodAutoscaler"))
        if shared and (claim is None or "ReadWriteMany" not in claim["spec"].get("accessModes", [])):
            problems.append(f"{c.where}: its spool is on claim {backing[4:]}, which several pods share: use volumeClaimTemplates (one volume per pod)")
    return problems


def _volumes(c: Container) -> dict[str, str]:
    """volume name → what backs it in the container's pod: 'pvc:<claim>', 'template', 'emptyDir', 'secret', ..."""
    out = {t["metadata"]["name"]: "template" for t in c.obj.get("spec", {}).get("volumeClaimTemplates", []) or []}
    for v in c.template.get("spec", {}).get("volumes", []) or []:
        kind = next((key for key in v if key != "name"), "?")
        out[v["name"]] = f"pvc:{v['persistentVolumeClaim']['claimName']}" if kind == "persistentVolumeClaim" else kind
    return out


def compose_spools(f: ComposeFile, procs: Processes) -> list[str]:
    """Rule 5 (compose): <data dir>/spool is on a named volume or a bind mount."""
    problems = []
    for c, ns, _ in procs:
        if ns.command not in SPOOLERS:
            continue
        spool = _spool(c, ns)
        if spool is None:
            problems.append(f"{c.where}: set ROLLOUTBUS_DATA_DIR and put <data dir>/spool on a volume")
        elif not any(source and under(spool, target) for source, target in volume_mounts(c.spec)):
            problems.append(f"{c.where}: its spool {spool} is on the container's writable layer (lost with the container): mount a named volume there")
    return problems


# --------------------------------------------------------------------------- rules 6 and 7


def _upstream(c: Container, ns: argparse.Namespace, s: Any, services: dict[str, set[int]], what: str) -> list[str]:
    url = getattr(ns, "upstream", None) or s.proxy_upstream
    if not url:
        return [f"{c.where}: the proxy has no upstream (--upstream / ROLLOUTBUS_PROXY_UPSTREAM)"]
    parsed = urlparse(str(url))
    host = parsed.hostname or ""
    first = host.split(".")[0]
    if "." in host and ".svc" not in host:
        return []  # a host outside the cluster / compose project: not ours to check
    if first not in services:
        return [f"{c.where}: the proxy forwards to {url}, but there is no {what} {first!r} (its policy server)"]
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    if services[first] and port not in services[first]:
        return [f"{c.where}: the proxy forwards to port {port} of {what} {first!r}, which offers {sorted(services[first])}"]
    return []


def k8s_upstream(k: Kustomization, procs: Processes) -> list[str]:
    """Rule 6 (k8s): the proxy forwards to a Service that exists (or to a host outside)."""
    return [p for c, ns, s in procs if ns.command == "proxy" for p in _upstream(c, ns, s, k.service_ports, "Service")]


def compose_upstream(f: ComposeFile, procs: Processes) -> list[str]:
    """Rule 6 (compose): the proxy forwards to a compose service that exists (or to a host outside)."""
    services: dict[str, set[int]] = {name: set() for name in f.services}
    return [p for c, ns, s in procs if ns.command == "proxy" for p in _upstream(c, ns, s, services, "compose service")]


def _proxy_url(c: Container, proxies: dict[str, set[int]], what: str) -> list[str]:
    problems = []
    for var in ("OPENAI_BASE_URL", "OPENAI_API_BASE"):
        url = c.env.get(var)
        if url and (urlparse(url).hostname or "").split(".")[0] in proxies:
            problems.append(f"{c.where}: {var}={url} points at the LLM proxy, which serves only "
                            "/rollout/<rollout id>/attempt/<attempt id>/v1/... (a bare /v1 is a 404): set ROLLOUTBUS_LLM_PROXY_URL "
                            "to the proxy's base URL and let the agent build each attempt's URL (producers.proxy.proxy_url)")
    url = c.env.get("ROLLOUTBUS_LLM_PROXY_URL")
    if not url:
        return problems + [f"{c.where}: sets no ROLLOUTBUS_LLM_PROXY_URL, the LLM proxy's base URL its agents call through"]
    parsed = urlparse(url)
    host = (parsed.hostname or "").split(".")[0]
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    if host not in proxies:
        problems.append(f"{c.where}: ROLLOUTBUS_LLM_PROXY_URL={url} names no {what} that runs `rolloutbus proxy` ({sorted(proxies)})")
    elif proxies[host] and port not in proxies[host]:
        problems.append(f"{c.where}: ROLLOUTBUS_LLM_PROXY_URL={url}: {what} {host!r} offers {sorted(proxies[host])}, not {port}")
    elif parsed.path.rstrip("/"):
        problems.append(f"{c.where}: ROLLOUTBUS_LLM_PROXY_URL={url} must be the proxy's base URL (no path): agents append /rollout/...")
    return problems


def k8s_proxy_url(k: Kustomization, procs: Processes) -> list[str]:
    """Rule 7 (k8s): runners reach a Service of the proxy through ROLLOUTBUS_LLM_PROXY_URL."""
    proxies = {name: k.service_ports[name] for name, svc in k.named("Service").items()
               if any(p.ns.command == "proxy" and k.selects(svc, p.container) for p in procs)}
    return [p for c, ns, _ in procs if ns.command == "run-agent" for p in _proxy_url(c, proxies, "Service")]


def compose_proxy_url(f: ComposeFile, procs: Processes) -> list[str]:
    """Rule 7 (compose): runners reach the proxy's service and port through ROLLOUTBUS_LLM_PROXY_URL."""
    proxies = {c.declared_in: {served[1]} for c, ns, s in procs if ns.command == "proxy" and (served := listener("proxy", s))}
    return [p for c, ns, _ in procs if ns.command == "run-agent" for p in _proxy_url(c, proxies, "compose service")]
