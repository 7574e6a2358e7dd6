#!/usr/bin/env bash
# Validates deploy/ offline (no Docker engine, no cluster needed); called by `make validate-deploy`.
#   compose : deploy/docker-compose.yml against the Compose Specification JSON schema + rules
#   k8s     : every kustomization under deploy/k8s rendered, then checked against the Kubernetes
#             schemas (strict) and the vendored CRD schemas + rules
#   commands: every container's command line parsed by the real `rolloutbus` parser, every ROLLOUTBUS_*
#             variable checked against the settings classes, Kafka users' ACLs against the groups and
#             topics the code uses, Service ports/probes against what each process serves, spools on
#             volumes, nothing on an open address without credentials (ports compose publishes on every
#             interface, /metrics without ROLLOUTBUS_METRICS_TOKEN), the read-only analyst ClickHouse
#             account, a `serve --engine vllm` policy server's vLLM image, GPU and model
#             (deploy/validate/commands.py, with the project's Python)
#   DDL     : the cluster form of deploy/clickhouse/migrations/ parsed and run (localised) in chDB, compared with it
# compose, k8s and commands read deploy/ through deploy/validate/model.py and run their rules from the one
# list in deploy/validate/rules.py; the facts taken from the code are in deploy/validate/facts.py.
# Installs its tools once into ~/.cache/rolloutbus/deploy-validate (a venv from PyPI; Kustomize from
# kubectl, or `go install` from the Go module proxy when kubectl is absent).
# Usage: deploy/validate.sh            run every check
#        deploy/validate.sh --tools    install the tools and print TOOL_PYTHON=... and KUSTOMIZE=...
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON="$(command -v python3)"
CACHE="${ROLLOUTBUS_CACHE_DIR:-$HOME/.cache/rolloutbus}/deploy-validate"
REQ=deploy/validate/requirements.txt
KUSTOMIZE_VERSION=v5.5.0

die() { echo "validate-deploy: $*" >&2; exit 1; }

install_tools() {
  local stamp="$CACHE/venv/.requirements" want
  want="$(cat "$REQ")"
  if [ ! -x "$CACHE/venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "validate-deploy: installing $(grep -v '^#' "$REQ" | tr '\n' ' ')into $CACHE/venv" >&2
    mkdir -p "$CACHE"
    { "$PYTHON" -m venv --clear "$CACHE/venv" && "$CACHE/venv/bin/python" -m pip install -q --disable-pip-version-check -r "$REQ"; } >"$CACHE/install.log" 2>&1 \
      || die "cannot install $REQ into $CACHE/venv (see $CACHE/install.log)"
    printf '%s' "$want" >"$stamp"
  fi
  TOOL_PYTHON="$CACHE/venv/bin/python"

  if command -v kubectl >/dev/null && kubectl kustomize --help >/dev/null 2>&1; then
    KUSTOMIZE="kubectl kustomize"
  elif command -v kustomize >/dev/null; then
    KUSTOMIZE="kustomize build"
  elif [ -x "$CACHE/bin/kustomize" ]; then
    KUSTOMIZE="$CACHE/bin/kustomize build"
  elif command -v go >/dev/null; then
    echo "validate-deploy: building kustomize $KUSTOMIZE_VERSION (go install, once)" >&2
    GOBIN="$CACHE/bin" go install "sigs.k8s.io/kustomize/kustomize/v5@$KUSTOMIZE_VERSION" >"$CACHE/kustomize.log" 2>&1 \
      || die "cannot build kustomize with go install (see $CACHE/kustomize.log)"
    KUSTOMIZE="$CACHE/bin/kustomize build"
  else
    die "need kubectl (apt-get install kubectl) or Go (to build kustomize) to render deploy/k8s"
  fi
}

install_tools
if [ "${1:-}" = "--tools" ]; then
  echo "TOOL_PYTHON=$TOOL_PYTHON"
  echo "KUSTOMIZE=$KUSTOMIZE"
  exit 0
fi

status=0
"$TOOL_PYTHON" deploy/validate/compose.py || status=1
"$TOOL_PYTHON" deploy/validate/k8s.py --kustomize "$KUSTOMIZE" || status=1
"$PYTHON" deploy/validate/commands.py --kustomize "$KUSTOMIZE" || status=1
"$PYTHON" deploy/validate/ddl.py || status=1
[ $status = 0 ] && echo "validate-deploy: ok (not run here: containers, a Kubernetes API server, a ClickHouse cluster; see deploy/README.md)"
exit $status
