"""The OpenAI-compatible server over the tiny policy: shapes, vLLM extras, batching, version swap."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch
from aiohttp.test_utils import TestClient, TestServer

from trainer.model import build_tiny, sequence_logprobs
from trainer.serve import VERSION_HEADER, Policy, PolicyServer

torch.set_num_threads(1)


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _client(server: PolicyServer) -> TestClient:
    client = TestClient(TestServer(server.app()))
    await client.start_server()
    return client


def test_chat_with_token_ids_and_logprobs() -> None:
    model, tok = build_tiny(seed=0)
    server = PolicyServer(Policy(model, tok, 3, "mem"))

    async def go() -> None:
        client = await _client(server)
        try:
            msgs = [{"role": "user", "content": "2+2"}]
            r = await client.post("/v1/chat/completions", json={"model": "policy", "messages": msgs, "max_tokens": 8,
                                                                 "logprobs": True, "return_token_ids": True})
            assert r.status == 200 and r.headers[VERSION_HEADER] == "3"
            body = await r.json()
            assert body["resource_version"] == 3
            assert body["prompt_token_ids"] == tok.apply_chat_template(msgs)
            ch = body["choices"][0]
            assert 1 <= len(ch["token_ids"]) <= 8 and ch["finish_reason"] in ("stop", "length")
            lps = [c["logprob"] for c in ch["logprobs"]["content"]]
            assert len(lps) == len(ch["token_ids"])
            # the reported logprobs are the policy's own (what GRPO's ratio needs)
            assert sequence_logprobs(model, body["prompt_token_ids"], ch["token_ids"]) == pytest.approx(lps, abs=1e-4)
            assert ch["message"]["content"] == tok.decode(ch["token_ids"])
            r = await client.post("/v1/completions", json={"prompt": "1+1=", "max_tokens": 4, "logprobs": True,
                                                           "return_token_ids": True, "temperature": 0})
            body = await r.json()
            ch = body["choices"][0]
            assert ch["prompt_token_ids"] == tok.encode("1+1=", add_bos=True) and len(ch["logprobs"]["token_logprobs"]) == len(ch["token_ids"])
            assert (await (await client.get("/healthz")).json())["resource_version"] == 3
            assert (await (await client.get("/v1/models")).json())["data"][0]["id"] == "policy"
            bad = await client.post("/v1/chat/completions", data=b"{not json")
            assert bad.status == 400 and "JSON" in (await bad.json())["error"]["message"]
            bad = await client.post("/v1/chat/completions", json={"messages": [{"role": "robot", "content": "x"}]})
            assert bad.status == 400
        finally:
            await client.close()

    _run(go())


def test_concurrent_requests_share_batches_and_swap_between_them() -> None:
    model, tok = build_tiny(seed=0)
    server = PolicyServer(Policy(model, tok, 1, "a"), max_batch=8)

    async def go() -> None:
        client = await _client(server)
        try:
            req = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}
            rs = await asyncio.gather(*[client.post("/v1/chat/completions", json=req) for _ in range(8)])
            assert all(r.status == 200 for r in rs)
            sampled = sum([(await r.json())["usage"]["completion_tokens"] for r in rs])
            assert server.steps_run < sampled  # several requests were sampled by the same forward passes
            other, _ = build_tiny(seed=1)
            server.offer(Policy(other, tok, 2, "b"))
            r = await client.post("/v1/chat/completions", json=req)
            assert r.headers[VERSION_HEADER] == "2"
            server.offer(Policy(model, tok, 1, "a"))  # an older version never replaces a newer one
            r = await client.post("/v1/chat/completions", json=req)
            assert r.headers[VERSION_HEADER] == "2"
        finally:
            await client.close()

    _run(go())


def test_a_short_request_answers_while_a_long_one_is_still_sampling() -> None:
    """Continuous batching: a request that joins later and needs few tokens does not wait for the long one."""
    model, tok = build_tiny(seed=0)

    class NoStop(type(tok)):  # type: ignore[misc]
        stop_ids = ()  # the untrained model must not end the long answer early

    no_stop = NoStop()
    server = PolicyServer(Policy(model, no_stop, 1, "a"), max_batch=8)

    async def go() -> None:
        client = await _client(server)
        try:
            order: list[str] = []

            async def ask(name: str, max_tokens: int, delay: float) -> int:
                await asyncio.sleep(delay)
                r = await client.post("/v1/completions", json={"prompt": "hello", "max_tokens": max_tokens, "temperature": 0})
                order.append(name)
                return int((await r.json())["usage"]["completion_tokens"])

            long, short = await asyncio.gather(ask("long", 400, 0.0), ask("short", 3, 0.05))
            assert (long, short) == (400, 3)
            assert order == ["short", "long"]
        finally:
            await client.close()

    _run(go())


def _lora_version(base_dir: Any, out: Any, rank: int, targets: tuple[str, ...], seed: int, adapter_base: Any = None) -> dict[str, Any]:
    """A LoRA trainer's checkpoint as `train --lora-rank` publishes it: the merged weights, and adapter/ naming the
    directory of the weights the adapters sit on. Returns the merged weights."""
    from trainer.lora import LoraSettings, apply_lora, merged_state_dict, write_adapter
    from trainer.model import load_policy, save_policy

    lora = LoraSettings(rank=rank, targets=targets)
    model, tok = load_policy(base_dir)
    peft_model = apply_lora(model, lora)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    state = peft_model.state_dict()
    merged = merged_state_dict(state, lora.scaling)
    plain, _tok = load_policy(base_dir)
    save_policy(plain, tok, out, state_dict=merged)
    write_adapter(out, state, lora, str(adapter_base or base_dir))
    return merged


def _assert_weights(model: Any, expected: dict[str, Any]) -> None:
    ours = model.state_dict()
    for key, value in expected.items():
        assert torch.allclose(ours[key], value, atol=1e-5), key


def test_torch_server_serves_a_lora_version_by_its_adapters_on_the_weights_it_holds(tmp_path: Any) -> None:
    """`rolloutbus serve --lora-rank R`: a version whose adapters sit on the checkpoint the server holds is served by
    reading adapter/ alone, on the same model object, and serves what its merged weights serve; the next version's
    adapters go on the base (a module adapted before and not now is the base's again); adapters above R, on weights
    the server does not hold, or that do not fit its model, and a server without --lora-rank, load full weights."""
    from trainer.model import load_policy, save_policy
    from trainer.serve import initial_policy

    model, tok = build_tiny(seed=0)
    base = save_policy(model, tok, tmp_path / "step-0")
    v1 = _lora_version(base, tmp_path / "step-1", 4, ("q_proj", "k_proj", "v_proj", "o_proj"), seed=1)
    v2 = _lora_version(base, tmp_path / "step-2", 4, ("q_proj",), seed=2)
    v3 = _lora_version(base, tmp_path / "step-3", 16, ("q_proj",), seed=3)
    server = PolicyServer(initial_policy(str(base)), lora_rank=8)
    held = server.policy.model
    base_weights = {k: v.clone() for k, v in held.state_dict().items()}

    server.load_version(str(tmp_path / "step-1"), 1)
    assert server.policy.version == 0, "staged until nothing is in flight"
    server._swap()
    assert (server.policy.version, server.policy.model is held) == (1, True)
    _assert_weights(held, v1)

    merged_server = PolicyServer(Policy(load_policy(tmp_path / "step-1")[0], tok, 1, str(tmp_path / "step-1")))

    async def answers(s: PolicyServer) -> tuple[str, list[int]]:
        client = await _client(s)
        try:
            r = await client.post("/v1/completions", json={"prompt": "12+7=", "max_tokens": 12, "temperature": 0,
                                                            "return_token_ids": True})
            assert r.status == 200
            return r.headers[VERSION_HEADER], (await r.json())["choices"][0]["token_ids"]
        finally:
            await client.close()

    assert _run(answers(server)) == _run(answers(merged_server))  # what a runner sees: version 1's answer

    server.load_version(str(tmp_path / "step-2"), 2)
    server._swap()
    assert (server.policy.version, server.policy.model is held) == (2, True)
    _assert_weights(held, v2)
    k = "model.layers.0.self_attn.k_proj.weight"
    assert torch.equal(held.state_dict()[k], base_weights[k]), "adapted in version 1 only: the base's again"

    server.load_version(str(tmp_path / "step-3"), 3)  # rank 16 > 8: the merged weights
    server._swap()
    assert (server.policy.version, server.policy.model is held) == (3, False)
    _assert_weights(server.policy.model, v3)

    other = save_policy(build_tiny(seed=5)[0], tok, tmp_path / "other")  # adapters on weights the server does not hold
    v4 = _lora_version(other, tmp_path / "step-4", 4, ("v_proj",), seed=4)
    server.load_version(str(tmp_path / "step-4"), 4)
    server._swap()
    assert server.policy.version == 4 and server._held is not None and server._held.uri == str(other)
    _assert_weights(server.policy.model, v4)
    then = server.policy.model
    v5 = _lora_version(other, tmp_path / "step-5", 4, ("o_proj",), seed=5)
    server.load_version(str(tmp_path / "step-5"), 5)
    server._swap()
    assert server.policy.model is then, "the base loaded once, then adapters alone"
    _assert_weights(then, v5)

    plain = PolicyServer(initial_policy(str(base)))  # no --lora-rank: every version's merged weights
    first = plain.policy.model
    plain.load_version(str(tmp_path / "step-1"), 1)
    plain._swap()
    assert plain.policy.version == 1 and plain.policy.model is not first
    _assert_weights(plain.policy.model, v1)


def test_torch_server_loads_merged_weights_when_adapters_do_not_fit_its_model(tmp_path: Any) -> None:
    """Adapters whose shapes the held model lacks (another model's under the same base path) are not applied: the
    version's merged weights are loaded and served."""
    from safetensors.torch import load_file, save_file

    from trainer.lora import ADAPTER_DIR, ADAPTER_WEIGHTS
    from trainer.model import save_policy
    from trainer.serve import initial_policy

    model, tok = build_tiny(seed=0)
    base = save_policy(model, tok, tmp_path / "step-0")
    v1 = _lora_version(base, tmp_path / "step-1", 4, ("q_proj",), seed=1)
    weights = tmp_path / "step-1" / ADAPTER_DIR / ADAPTER_WEIGHTS
    tensors = load_file(str(weights))
    save_file({k: torch.cat([v, v]) if "lora_B" in k else v for k, v in tensors.items()}, str(weights))  # B twice as tall
    server = PolicyServer(initial_policy(str(base)), lora_rank=8)
    held = server.policy.model
    server.load_version(str(tmp_path / "step-1"), 1)
    server._swap()
    assert (server.policy.version, server.policy.model is held) == (1, False)
    _assert_weights(server.policy.model, v1)
