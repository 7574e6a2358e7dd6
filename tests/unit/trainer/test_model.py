"""Tokenizer, tiny model build/save/load, sampling with behaviour log-probs, and SFT."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from foundation.errors import ConfigError
from trainer.model import ContextTooLong, ContinuousBatch, base_model_name, build_tiny, generate, generate_batch, load_policy, save_policy, sequence_logprobs
from trainer.sft import SFTConfig, sft
from trainer.tokenizer import CharTokenizer, load_tokenizer

torch.set_num_threads(1)


def test_tokenizer_ids_and_round_trip(tmp_path: Path) -> None:
    tok = CharTokenizer()
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    assert [tok.role_id(r) for r in ("system", "user", "assistant", "tool")] == [3, 4, 5, 6]
    assert tok.end_id == 7
    text = "What is 12*(3+4)?\nAnswer: 84 ~ ok"
    assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode(text)) == len(text)
    assert tok.encode("é") == tok.encode("?")  # outside ASCII → '?', not a crash
    tok.save(tmp_path)
    again = load_tokenizer(tmp_path)
    assert isinstance(again, CharTokenizer) and again.id_to_token == tok.id_to_token


def test_chat_template_ends_with_assistant_marker() -> None:
    tok = CharTokenizer()
    ids = tok.apply_chat_template([{"role": "system", "content": "be brief"}, {"role": "user", "content": "1+1"}])
    assert ids[0] == tok.bos_id and ids[-1] == tok.role_id("assistant")
    assert tok.decode(ids, skip_special=False) == "<bos><|system|>be brief<|end|><|user|>1+1<|end|><|assistant|>"
    with pytest.raises(ConfigError, match="role"):
        tok.apply_chat_template([{"role": "robot", "content": "x"}])


def test_build_save_load_same_outputs(tmp_path: Path) -> None:
    model, tok = build_tiny(seed=3)
    assert model.config.vocab_size == len(tok)
    save_policy(model, tok, tmp_path / "m")
    assert (tmp_path / "m" / "model.safetensors").exists()
    loaded, tok2 = load_policy(tmp_path / "m")
    ids = torch.tensor([tok.apply_chat_template([{"role": "user", "content": "hi"}])])
    assert torch.allclose(model(input_ids=ids).logits, loaded(input_ids=ids).logits)
    assert base_model_name(loaded) == "rolloutbus-tiny"
    # the same seed builds the same weights
    again, _ = build_tiny(seed=3)
    assert torch.equal(again(input_ids=ids).logits, model(input_ids=ids).logits)
    with pytest.raises(ConfigError, match="config.json"):
        load_policy(tmp_path / "nothing")


def test_generate_returns_behaviour_logprobs_of_the_sampled_tokens() -> None:
    model, tok = build_tiny(seed=0)
    prompt = tok.apply_chat_template([{"role": "user", "content": "2+2"}])
    ids, lps = generate(model, tok, prompt, max_new_tokens=12, temperature=1.0, generator=torch.Generator().manual_seed(1))
    assert 1 <= len(ids) <= 12 and len(lps) == len(ids)
    assert all(lp <= 0 for lp in lps)
    assert sequence_logprobs(model, prompt, ids) == pytest.approx(lps, abs=1e-4)
    # at temperature 0.5 the reported logprobs are of the sharpened distribution
    ids2, lps2 = generate(model, tok, prompt, max_new_tokens=8, temperature=0.5, generator=torch.Generator().manual_seed(1))
    assert sequence_logprobs(model, prompt, ids2, temperature=0.5) == pytest.approx(lps2, abs=1e-4)


def test_batched_generation_matches_one_at_a_time() -> None:
    model, tok = build_tiny(seed=0)
    prompts = [tok.encode("ab", add_bos=True), tok.encode("a much longer prompt", add_bos=True)]
    batch = generate_batch(model, prompts, max_new_tokens=[4, 6], temperature=0.0)
    for p, g, n in zip(prompts, batch, (4, 6)):
        alone = generate_batch(model, [p], max_new_tokens=n, temperature=0.0)[0]
        assert g.token_ids == alone.token_ids and len(g.token_ids) == n and g.finish_reason == "length"
        assert g.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
    with pytest.raises(ContextTooLong):
        generate_batch(model, [[1] * 5000], max_new_tokens=1)


def test_rows_join_and_leave_a_running_batch_without_changing_what_they_sample() -> None:
    """Continuous batching: a request admitted while others are mid-answer, and rows that finish early,
    get exactly the greedy answer (and the log-probs) they get alone; a prompt that cannot run fails alone."""
    model, tok = build_tiny(seed=0)
    shared = tok.encode("You answer sums. ", add_bos=True)
    prompts = {"a": shared + tok.encode("2+2="), "b": shared + tok.encode("a much longer question: 17+25="),
               "c": tok.encode("unrelated", add_bos=True), "d": shared + tok.encode("9+1="), "e": shared + tok.encode("5+5=")}
    lengths = {"a": 3, "b": 9, "c": 6, "d": 5, "e": 7}
    alone = {k: generate_batch(model, [p], max_new_tokens=lengths[k], temperature=0.0)[0] for k, p in prompts.items()}
    batch = ContinuousBatch(model, pad_id=tok.pad_id)
    got: dict[str, object] = {}
    got.update(batch.admit([("a", prompts["a"], 3, 0.0), ("b", prompts["b"], 9, 0.0), ("long", [1] * 5000, 4, 0.0)]))
    assert isinstance(got.pop("long"), ContextTooLong) and len(batch) == 2
    for step in range(12):
        if step == 1:  # mid-flight, alone: it starts with the prefix kept from the first admission
            fed: list[int] = []
            real = model.forward
            model.forward = lambda *a, **kw: fed.append(kw["input_ids"].shape[1]) or real(*a, **kw)  # type: ignore[method-assign]
            try:
                got.update(batch.admit([("d", prompts["d"], 5, 0.0)]))
            finally:
                model.forward = real  # type: ignore[method-assign]
            assert fed == [len(prompts["d"]) - len(shared)]  # only its own suffix is prefilled
        if step == 2:  # one that shares nothing, admitted with one that reuses the kept prefix
            got.update(batch.admit([("c", prompts["c"], 6, 0.0), ("e", prompts["e"], 7, 0.0)]))
        got.update(batch.step())
        if step == 1:
            assert "a" in got and len(batch) == 2  # "a" left; the others go on without it
    assert len(batch) == 0 and set(got) == set(prompts)
    for k, g in got.items():
        assert g.token_ids == alone[k].token_ids, k  # type: ignore[attr-defined]
        assert g.logprobs == pytest.approx(alone[k].logprobs, abs=1e-4), k  # type: ignore[attr-defined]
    # The next turn resends the previous one: what "b" was given and answered is kept, only the rest is prefilled.
    turn2 = prompts["b"] + got["b"].token_ids + tok.encode(" and 3+3=")  # type: ignore[attr-defined]
    fed.clear()
    model.forward = lambda *a, **kw: fed.append(kw["input_ids"].shape[1]) or real(*a, **kw)  # type: ignore[method-assign]
    try:
        first = batch.admit([("b2", turn2, 4, 0.0)])
    finally:
        model.forward = real  # type: ignore[method-assign]
    assert fed == [len(tok.encode(" and 3+3=")) + 1]  # the last answer token was never fed, so it is prefilled too
    while len(batch):
        first += batch.step()
    assert first[0][1].token_ids == generate_batch(model, [turn2], max_new_tokens=4, temperature=0.0)[0].token_ids  # type: ignore[union-attr]


def test_sft_teaches_the_response_and_to_stop() -> None:
    model, tok = build_tiny(seed=0)
    pairs = [([{"role": "user", "content": f"{a}+{b}"}], str(a + b)) for a in range(4) for b in range(4)]
    losses = sft(model, tok, pairs, SFTConfig(epochs=60, lr=3e-3, batch_size=16))
    assert losses[-1] < 0.05 * losses[0]
    for prompt, answer in pairs:
        ids, _ = generate(model, tok, tok.apply_chat_template(prompt), max_new_tokens=6, temperature=0.0)
        assert tok.decode(ids) == answer and ids[-1] == tok.end_id


def test_a_sliding_window_model_is_refused_with_a_clear_error() -> None:
    """Its cache keeps only the last window of tokens: merging rows by left padding would be wrong, so refuse."""
    from transformers import MistralConfig, MistralForCausalLM

    from foundation.errors import RolloutbusError

    model = MistralForCausalLM(MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=4, num_key_value_heads=2, sliding_window=8))
    with pytest.raises(RolloutbusError, match="sliding-window attention"):
        ContinuousBatch(model).admit([("a", [1, 2, 3], 2, 0.0)])
