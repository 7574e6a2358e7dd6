#!/usr/bin/env bash
# Prometheus and promtool for the monitoring tests: Debian's `prometheus` package (2.42), installed with
# apt-get when either is missing and this runs as root. The package's own service is not started
# (RUNLEVEL=1 keeps invoke-rc.d from starting it): the tests run their own Prometheus on a free port.
set -euo pipefail
if command -v promtool >/dev/null && command -v prometheus >/dev/null; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "the monitoring tests need Prometheus and promtool: sudo apt-get install -y prometheus" >&2
  exit 1
fi
echo "installing prometheus and promtool (apt-get)"
apt-get update -qq
RUNLEVEL=1 DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
# Where a service manager started it anyway, stop it: nothing of ours uses the system's instance.
if [ -x /etc/init.d/prometheus ] && /etc/init.d/prometheus status >/dev/null 2>&1; then
  /etc/init.d/prometheus stop >/dev/null 2>&1 || true
fi
promtool --version 2>&1 | head -1
