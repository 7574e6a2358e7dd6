"""Every image the local container run needs, built on this host and cached by the content it is built from.

No public registry is reachable here, so every image starts from Debian packages:

- ``rolloutbus-base``: ``debootstrap --variant=minbase bookworm``, imported with ``podman import``;
- ``rolloutbus-kafka``: the base + Debian's JRE + the Kafka jars fetched with Maven
  (``deploy/containers/kafka/pom.xml``, same version as ``deploy/kafka/pom.xml``), laid out like the
  apache/kafka image (``/opt/kafka/bin``, configured from ``KAFKA_*`` variables);
- ``rolloutbus``: ``deploy/Dockerfile`` on the base, everything installed (torch: trainer, policy server);
- ``rolloutbus-slim``: the same file with the extras gateway, streams, store, query, no torch (gateway,
  proxy, stream workers, runners of the calculator agent, the store, init).

Each image is tagged with a hash of its inputs (files, build arguments, its base's tag); a build whose tag
already exists is skipped. ``python deploy/containers/images.py`` builds what is missing and prints the
``NAME=image`` lines the compose override reads.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host import REPO, HERE, HostError, cache_dir, ensure_tools, env, podman  # noqa: E402

Say = Callable[[str], None]

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
BASE_RECIPE = "1"  # bump to rebuild the base (what debootstrap is asked for is in the hash too)
# pyproject extras of the two rolloutbus images: slim has no torch (nothing it runs imports it).
FULL_EXTRAS = "all"
SLIM_EXTRAS = "gateway,streams,store,query"
# What deploy/Dockerfile copies from the repository (besides itself).
PROJECT_FILES = ["pyproject.toml", "README.md", "LICENSE", "foundation", "rolloutbus", "producers", "streams", "schemas",
                 "trainer", "deploy/clickhouse"]
# native/'s sources: the compiled hot paths, built into a wheel on this host (cargo is not in the image).
NATIVE_FILES = ["native/Cargo.toml", "native/Cargo.lock", "native/pyproject.toml", "native/src"]
SKIP_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache"}
SKIP_SUFFIXES = (".pyc", ".pyo")


def _files(root: Path, rel: Iterable[str]) -> list[Path]:
    out: list[Path] = []
    for r in rel:
        p = root / r
        if p.is_file():
            out.append(p)
            continue
        for dirpath, dirnames, filenames in os.walk(p):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info"))
            out += [Path(dirpath) / f for f in sorted(filenames) if not f.endswith(SKIP_SUFFIXES)]
    return out


def content_hash(root: Path, files: Iterable[Path], *extra: str) -> str:
    """sha256 over the files' paths (relative to root), modes and bytes, and the extra strings."""
    h = hashlib.sha256()
    for f in sorted(files):
        h.update(str(f.relative_to(root)).encode() + b"\0")
        h.update(b"x" if os.access(f, os.X_OK) else b"-")
        h.update(hashlib.sha256(f.read_bytes()).digest())
    for e in extra:
        h.update(b"\0" + e.encode())
    return h.hexdigest()[:16]


def exists(ref: str) -> bool:
    return podman("image", "exists", ref, check=False).returncode == 0


def prune_old_tags(ref: str, keep: int = 2) -> None:
    """Untag all but the newest ``keep`` tags of ``ref``'s repository (their layers stay as build cache)."""
    repo = ref.rsplit(":", 1)[0]
    proc = podman("images", "--format", "{{.Repository}}:{{.Tag}} {{.CreatedAt}}", repo, check=False)
    tags = []
    for line in proc.stdout.splitlines():
        name, _, created = line.partition(" ")
        if name.startswith(repo + ":") and name != ref:
            tags.append((created, name))
    for _, name in sorted(tags, reverse=True)[max(0, keep - 1):]:
        podman("untag", name, check=False)


def _build(ref: str, context: Path, dockerfile: Path, args: dict[str, str], volumes: list[str], say: Say) -> None:
    cmd = ["build", "--isolation=chroot", "--layers", "-t", ref, "-f", str(dockerfile)]
    for k, v in args.items():
        cmd += ["--build-arg", f"{k}={v}"]
    for v in volumes:
        cmd += ["-v", v]
    log = cache_dir() / "logs" / f"build-{ref.split('/')[-1].replace(':', '-')}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.run(["podman", *cmd, str(context)], env=env(), stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = log.read_text().strip().splitlines()[-15:]
        raise HostError(f"building {ref} failed (log {log}):\n  " + "\n  ".join(tail))
    say(f"built {ref} in {time.monotonic() - t0:.0f}s (log {log})")
    prune_old_tags(ref)


# ------------------------------------------------------------------------------------------ base


def base_image(say: Say = print) -> str:
    """A Debian bookworm minbase, from debootstrap."""
    tag = hashlib.sha256(f"{SUITE} minbase {MIRROR} {BASE_RECIPE}".encode()).hexdigest()[:16]
    ref = f"localhost/rolloutbus-base:{tag}"
    if exists(ref):
        return ref
    if not shutil.which("debootstrap"):
        raise HostError("debootstrap missing: run `python deploy/containers/stack.py host` (apt-get install debootstrap)")
    t0 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="rb-rootfs-", dir=cache_dir()))
    try:
        rootfs = work / "rootfs"
        proc = subprocess.run(["debootstrap", "--variant=minbase", SUITE, str(rootfs), MIRROR],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
            raise HostError(f"debootstrap {SUITE} failed: {tail}")
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for f in (rootfs / junk).glob("*"):
                if f.is_file():
                    f.unlink()
        (rootfs / "etc/apt/apt.conf.d/docker-clean").write_text(
            'DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb || true"; };\n')
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        imp = subprocess.run(["podman", "import", "--change", "CMD=/bin/bash", "-", ref], stdin=tar.stdout,
                             env=env(), capture_output=True, text=True)
        tar.wait()
        if imp.returncode != 0 or tar.returncode != 0:
            raise HostError(f"podman import of the base failed: {imp.stderr.strip()[-500:]}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    say(f"built {ref} (debootstrap {SUITE} minbase + podman import) in {time.monotonic() - t0:.0f}s")
    return ref


# ------------------------------------------------------------------------------------------ kafka


def kafka_version() -> str:
    pom = (REPO / "deploy" / "kafka" / "pom.xml").read_text()
    m = re.search(r"<kafka.version>([^<]+)</kafka.version>", pom)
    if not m:
        raise HostError("deploy/kafka/pom.xml names no <kafka.version>")
    return m.group(1)


def kafka_jars(version: str, say: Say = print) -> Path:
    """The broker's and the tools' jars (kafka_2.13 + kafka-tools), fetched once with Maven."""
    target = cache_dir() / f"kafka-{version}-libs"
    if (target / ".complete").exists():
        return target
    if not shutil.which("mvn"):
        raise HostError("mvn missing: `make setup` installs Maven (the Kafka image's jars come from Maven Central)")
    tmp = target.with_name(target.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    proc = subprocess.run(["mvn", "-B", "-q", "-f", str(HERE / "kafka" / "pom.xml"), f"-Dkafka.version={version}",
                           "dependency:copy-dependencies", f"-DoutputDirectory={tmp}", "-DincludeScope=runtime"],
                          capture_output=True, text=True)
    if proc.returncode != 0 or not any(tmp.glob("kafka-tools-*.jar")):
        tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
        raise HostError(f"could not fetch Kafka's jars from Maven Central: {tail}")
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    (target / ".complete").write_text(version)
    say(f"fetched Kafka {version} jars into {target}")
    return target


def kafka_image(base: str, say: Say = print) -> str:
    version = kafka_version()
    jars = kafka_jars(version, say)
    src = HERE / "kafka"
    jar_list = sorted(jars.glob("*.jar"))
    tag = content_hash(HERE, _files(src, ["."]), base, version,
                       *(f"{j.name}:{j.stat().st_size}" for j in jar_list))
    ref = f"localhost/rolloutbus-kafka:{tag}"
    if exists(ref):
        return ref
    ctx = Path(tempfile.mkdtemp(prefix="rb-kafka-ctx-", dir=cache_dir()))
    try:
        shutil.copytree(src, ctx, dirs_exist_ok=True)
        (ctx / "libs").mkdir()
        for j in jar_list:
            os.link(j, ctx / "libs" / j.name) if j.stat().st_dev == ctx.stat().st_dev else shutil.copy2(j, ctx / "libs")
        _build(ref, ctx, ctx / "Dockerfile", {"BASE_IMAGE": base, "KAFKA_VERSION": version}, [], say)
    finally:
        shutil.rmtree(ctx, ignore_errors=True)
    return ref


# ------------------------------------------------------------------------------------------ rolloutbus


def ca_bundle() -> Path | None:
    """The host's CA bundle (pip inside a build trusts what this host trusts, e.g. an egress proxy's CA)."""
    for p in (os.environ.get("PIP_CERT"), os.environ.get("SSL_CERT_FILE"), "/etc/ssl/certs/ca-certificates.crt"):
        if p and Path(p).is_file():
            return Path(p)
    return None


def native_wheel(dest: Path, say: Say = print) -> Path | None:
    """native/ built into a wheel in ``dest`` with this host's cargo (the image's Debian has none recent
    enough); None, said in one line, when there is no cargo or the build fails: the image then runs the
    Python paths (its span stage says so once)."""
    path = os.pathsep.join([os.environ.get("PATH", ""), str(Path.home() / ".cargo" / "bin")])
    if shutil.which("cargo", path=path) is None:
        say("native/: no cargo on this host: the images run the Python paths")
        return None
    dest.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dest), str(REPO / "native")],
                          env={**os.environ, "PATH": path}, capture_output=True, text=True)
    wheels = sorted(dest.glob("rolloutbus_native-*.whl"))
    if proc.returncode != 0 or not wheels:
        say(f"native/ did not build (the images run the Python paths): {(proc.stderr or proc.stdout).strip()[-300:]}")
        return None
    return wheels[-1]


def project_image(base: str, slim: bool, say: Say = print) -> str:
    dockerfile = REPO / "deploy" / "Dockerfile"
    files = _files(REPO, PROJECT_FILES)
    args = {"BASE_IMAGE": base, "EXTRAS": SLIM_EXTRAS if slim else FULL_EXTRAS, "PIP_NO_CACHE": "0"}
    tag = content_hash(REPO, [*files, *_files(REPO, NATIVE_FILES), dockerfile], *(f"{k}={v}" for k, v in sorted(args.items())))
    ref = f"localhost/rolloutbus{'-slim' if slim else ''}:{tag}"
    if exists(ref):
        return ref
    ctx = Path(tempfile.mkdtemp(prefix="rb-ctx-", dir=cache_dir()))
    try:
        for f in [*files, dockerfile]:
            dest = ctx / f.relative_to(REPO)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dest)
        (ctx / "native" / "wheels").mkdir(parents=True, exist_ok=True)  # deploy/Dockerfile installs what is here
        native_wheel(ctx / "native" / "wheels", say)
        pip_cache = cache_dir() / "pip"
        pip_cache.mkdir(parents=True, exist_ok=True)
        volumes = [f"{pip_cache}:/root/.cache/pip"]
        ca = ca_bundle()
        if ca:
            volumes.append(f"{ca}:/etc/rolloutbus-build-ca.crt:ro")
            args["CA_BUNDLE"] = "/etc/rolloutbus-build-ca.crt"
        _build(ref, ctx, ctx / "deploy" / "Dockerfile", args, volumes, say)
    finally:
        shutil.rmtree(ctx, ignore_errors=True)
    return ref


# ------------------------------------------------------------------------------------------ all


def build_all(say: Say = print, full: bool = True) -> dict[str, str]:
    """Build (or find) every image; returns the variables the compose override reads."""
    cache_dir().mkdir(parents=True, exist_ok=True)
    base = base_image(say)
    images = {
        "RB_BASE_IMAGE": base,
        "KAFKA_IMAGE": kafka_image(base, say),
        "ROLLOUTBUS_SLIM_IMAGE": project_image(base, slim=True, say=say),
    }
    if full:
        images["ROLLOUTBUS_IMAGE"] = project_image(base, slim=False, say=say)
    return images


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        ensure_tools(lambda m: print(m, file=sys.stderr))
        images = build_all(lambda m: print(m, file=sys.stderr), full="--slim-only" not in argv)
    except HostError as exc:
        print(f"images: {exc}", file=sys.stderr)
        return 1
    for k, v in images.items():
        print(f"{k}={v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
