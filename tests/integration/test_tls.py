"""HTTPS for every HTTP service: ``--tls-cert`` / ``--tls-key`` (``ROLLOUTBUS_TLS_CERT`` / ``_KEY``).

A self-signed certificate for 127.0.0.1 (``cryptography`` when installed, else the ``openssl`` command).
The gateway on 0.0.0.0 with TLS and its token starts and takes spans over HTTPS; the store answers SQL
over HTTPS; the LLM proxy, the policy server and the dashboard answer over HTTPS; plain HTTP to any of
them gets no answer and leaves it serving; a certificate without its key, with another's key, or a file
that is not there stops the start with one line and exit 2."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.installs import missing
import requests

from tests.integration.serverprocs import free_port as _free_port
from tests.integration.serverprocs import stop as _stop
from tests.integration.serverprocs import wait_http

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
TOKEN = "tls-gw-token-77"


def self_signed(folder: Path, name: str = "server") -> tuple[Path, Path]:
    cert, key = folder / f"{name}.crt", folder / f"{name}.key"
    try:
        import datetime

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        if shutil.which("openssl") is None:
            missing("the cryptography package and the openssl command (one makes the test's certificate)",
                    "pip install -e '.[all,test]' (cryptography) or apt-get install openssl")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                        "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=127.0.0.1",
                        "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"], check=True, capture_output=True)
        return cert, key
    import ipaddress

    k = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    c = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(k.public_key())
         .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
         .not_valid_after(now + datetime.timedelta(days=2))
         .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
                        critical=False)
         .sign(k, hashes.SHA256()))
    cert.write_bytes(c.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return cert, key


def _env(base: dict[str, str], **extra: str) -> dict[str, str]:
    return {**base, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", **extra}


def _plain_http_is_not_answered(port: int) -> None:
    with pytest.raises(requests.RequestException):
        r = requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
        raise AssertionError(f"plain HTTP answered {r.status_code}")  # pragma: no cover - a failure shows here


def test_gateway_on_an_open_address_with_tls_and_token_takes_spans_over_https(test_env: dict[str, str], tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    port, log = _free_port(), tmp_path / "gateway.log"
    env = _env(test_env, ROLLOUTBUS_GATEWAY_TOKEN=TOKEN, ROLLOUTBUS_DATA_DIR=str(tmp_path / "gw"),
               ROLLOUTBUS_TLS_KEY=str(key))  # the key from the variable, the certificate from the flag
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "producers.ingest.gateway_cli", "--host", "0.0.0.0", "--port", str(port),
                                 "--tls-cert", str(cert)], env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    base = f"https://127.0.0.1:{port}"
    try:
        wait_http(f"{base}/healthz", proc, log, verify=str(cert))
        assert requests.get(f"{base}/healthz", timeout=5, verify=str(cert)).json()["status"] == "ok"
        body = {"resourceSpans": [{"resource": {"attributes": [
            {"key": "agentlightning.rollout_id", "value": {"stringValue": "ro-tls"}},
            {"key": "agentlightning.attempt_id", "value": {"stringValue": "at-1"}}]},
            "scopeSpans": [{"spans": [{"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331", "name": "x"}]}]}]}
        ok = requests.post(f"{base}/v1/traces", json=body, timeout=10, verify=str(cert), headers={"Authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200 and "rejectedSpans" not in ok.text, ok.text
        assert requests.post(f"{base}/v1/traces", json=body, timeout=10, verify=str(cert)).status_code == 401
        with pytest.raises(requests.exceptions.SSLError):  # a client that does not trust the certificate is refused
            requests.get(f"{base}/healthz", timeout=5)
        _plain_http_is_not_answered(port)
        metrics = requests.get(f"{base}/metrics", timeout=5, verify=str(cert), headers={"Authorization": f"Bearer {TOKEN}"})
        assert "rolloutbus_gateway_spans_accepted_total 1.0" in metrics.text
    finally:
        _stop(proc)
    text = log.read_text(errors="replace")
    assert "gateway on https://0.0.0.0" in text and "Traceback" not in text, text[-3000:]


def test_store_answers_sql_over_https(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    port, log = _free_port(), tmp_path / "store.log"
    env = _env({k: v for k, v in os.environ.items() if not k.startswith("ROLLOUTBUS_")},
               ROLLOUTBUS_TLS_CERT=str(cert), ROLLOUTBUS_TLS_KEY=str(key))
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "rolloutbus.cli", "--data-dir", str(tmp_path / "data"), "store",
                                 "--port", str(port)], env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    base = f"https://127.0.0.1:{port}"
    try:
        wait_http(f"{base}/ping", proc, log, verify=str(cert))
        _plain_http_is_not_answered(port)
        r = requests.post(base, data="SELECT 40 + 2", timeout=30, verify=str(cert))
        assert r.status_code == 200 and r.text.strip() == "42", r.text
    finally:
        _stop(proc)
    text = log.read_text(errors="replace")
    assert f"serving https://127.0.0.1:{port}" in text and "Traceback" not in text, text[-3000:]


# command: (the flags it needs besides TLS, a GET path that answers 200 once it is up)
SERVICES = {
    "proxy": (["--upstream", "http://127.0.0.1:9/v1"], "/healthz"),
    "serve": (["--model", "tiny", "--no-follow", "--threads", "1"], "/healthz"),
    "dashboard": (["--no-kafka-lag"], "/healthz"),
}


@pytest.mark.parametrize("command", list(SERVICES))
def test_proxy_serve_and_dashboard_answer_over_https_only(command: str, tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    port, log = _free_port(), tmp_path / f"{command}.log"
    flags, health = SERVICES[command]
    env = _env({k: v for k, v in os.environ.items() if not k.startswith("ROLLOUTBUS_")},
               ROLLOUTBUS_TLS_CERT=str(cert), ROLLOUTBUS_DATA_DIR=str(tmp_path / "data"))  # the key from the flag
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "rolloutbus.cli", command, "--port", str(port), "--tls-key", str(key),
                                 *flags], env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    base = f"https://127.0.0.1:{port}"
    try:
        wait_http(f"{base}{health}", proc, log, timeout=120, verify=str(cert))
        assert requests.get(f"{base}{health}", timeout=5, verify=str(cert)).status_code == 200
        _plain_http_is_not_answered(port)
        with pytest.raises(requests.exceptions.SSLError):  # a client that does not trust the certificate is refused
            requests.get(f"{base}{health}", timeout=5)
        assert requests.get(f"{base}{health}", timeout=5, verify=str(cert)).status_code == 200  # still serving
    finally:
        _stop(proc)
    text = log.read_text(errors="replace")
    assert f"https://127.0.0.1:{port}" in text and "Traceback" not in text, text[-3000:]


@pytest.mark.parametrize("command", ["gateway", "store", *SERVICES])
def test_a_certificate_without_its_key_or_with_another_key_stops_the_start_in_one_line(
        command: str, test_env: dict[str, str], tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    _other_cert, other_key = self_signed(tmp_path, "other")
    env = _env(test_env, ROLLOUTBUS_DATA_DIR=str(tmp_path / "d"))
    cases = {
        "no key": (["--tls-cert", str(cert)], "--tls-key"),
        "another key": (["--tls-cert", str(cert), "--tls-key", str(other_key)], str(other_key)),
        "no such file": (["--tls-cert", str(tmp_path / "nope.crt"), "--tls-key", str(key)], "nope.crt"),
    }
    for label, (flags, named) in cases.items():
        needed = SERVICES[command][0] if command in SERVICES else []
        r = subprocess.run([sys.executable, "-m", "rolloutbus.cli", command, "--port", str(_free_port()), *needed, *flags],
                           env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, (label, r.stderr)
        assert named in lines[0] and "PRIVATE KEY" not in r.stderr, (label, lines[0])
