"""The torch backend really optimises: loss goes down, positive-advantage responses become likelier."""

from __future__ import annotations

import copy

import pytest
import torch

from schemas.models import GroupBatch, Transition
from trainer.grpo import GRPOConfig
from trainer.model import build_tiny, sequence_logprobs, train_top_layers
from trainer.synthetic import prompt_groups, sample_groups
from trainer.torch_backend import (Sample, TorchGRPOBackend, collate, first_scored, micro_batches, samples_from_groups, shared_batches,
                                    shared_lower_layers)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny() -> tuple[object, object, list[GroupBatch]]:
    model, tok = build_tiny(seed=0)
    groups = sample_groups(model, tok, n_groups=4, group_size=4, max_new_tokens=10, seed=1)
    return model, tok, groups


def _mean_logp(model: object, t: Transition) -> float:
    lps = sequence_logprobs(model, t.prompt_token_ids, t.response_token_ids)
    return sum(lps) / len(lps)


def test_training_on_a_fixed_batch_lowers_loss_and_favours_positive_advantage(tiny: tuple) -> None:
    base, tok, groups = tiny
    model = copy.deepcopy(base)
    backend = TorchGRPOBackend(model, grpo=GRPOConfig(loss_agg="grpo"), lr=3e-3, micro_batch_tokens=512, pad_id=tok.pad_id)
    pos = [t for g in groups for t in g.transitions if t.advantage > 0.5]
    neg = [t for g in groups for t in g.transitions if t.advantage < -0.5]
    assert pos and neg
    before_pos = [_mean_logp(model, t) for t in pos]
    before_neg = [_mean_logp(model, t) for t in neg]
    losses = [backend.step(groups)["loss"] for _ in range(8)]
    # on-policy start: ratio 1, group-centred advantages → loss ~0; then it must fall
    assert abs(losses[0]) < 0.05
    # clipping bounds how far below 0 it can go (about -eps * mean|A| = -0.2 * ~0.8)
    assert losses[-1] < -0.05 and losses[-1] < losses[1] < losses[0]
    after_pos = [_mean_logp(model, t) for t in pos]
    after_neg = [_mean_logp(model, t) for t in neg]
    assert all(a > b for a, b in zip(after_pos, before_pos))
    # A short negative response can share its tokens with longer positive ones of its group (the reward
    # favours length here) and so rise with them: negatives fall on average, not each one.
    assert sum(after_neg) < sum(before_neg)


@pytest.mark.parametrize("share_prefix", [False, True])
def test_micro_batching_gives_the_full_batch_gradient(tiny: tuple, share_prefix: bool) -> None:
    base, tok, groups = tiny
    if share_prefix:
        groups = prompt_groups(len(tok), n_groups=3, group_size=4, prompt_tokens=128, response_tokens=8)
    samples = samples_from_groups(groups).samples
    grads = []
    for mbt in (100_000, 40):  # one micro-batch (one per shared prompt) vs (almost) one row at a time
        model = copy.deepcopy(base)
        backend = TorchGRPOBackend(model, grpo=GRPOConfig(loss_agg="dapo", kl_beta=0.0), micro_batch_tokens=mbt, pad_id=tok.pad_id,
                                   share_prefix=share_prefix)
        m = backend.accumulate(samples)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
        assert (m["micro_batches"] == len(backend.pack(samples)) == (len(groups) if share_prefix else 1)) == (mbt == 100_000)
    assert torch.allclose(grads[0], grads[1], atol=1e-5, rtol=1e-3)


def test_kl_to_reference_is_zero_at_start_and_grows(tiny: tuple) -> None:
    base, tok, groups = tiny
    model = copy.deepcopy(base)
    backend = TorchGRPOBackend(
        model, grpo=GRPOConfig(kl_beta=0.05), lr=3e-3, ref_model=copy.deepcopy(base), pad_id=tok.pad_id
    )
    first = backend.step(groups)
    second = backend.step(groups)
    assert first["kl"] == pytest.approx(0.0, abs=1e-6)
    assert second["kl"] > 0.0
    assert 0.0 <= second["clip_fraction"] <= 1.0 and second["tokens_per_s"] > 0


def test_masking_and_malformed_rows() -> None:
    t_ok = Transition(
        rollout_id="r", attempt_id="a", task_id="t", span_id="s", turn=0, prompt_token_ids=[1, 4, 9],
        response_token_ids=[10, 11, 12, 13], response_logprobs=[-1.0, -1.0, -1.0, -1.0], response_mask=[1, 0, 0, 1], advantage=1.0,
    )
    t_bad = t_ok.model_copy(update={"response_mask": [1, 1]})
    t_empty = t_ok.model_copy(update={"response_token_ids": [], "response_logprobs": [], "response_mask": []})
    g = GroupBatch(group_id="g", task_id="t", created_ns=0, group_size=3, rollout_ids=["r"] * 3, rewards=[1, 0, 0], advantages=[1, 0, 0], transitions=[t_ok, t_bad, t_empty])
    rep = samples_from_groups([g], [0.5])
    assert (len(rep.samples), rep.skipped_malformed, rep.empty_response) == (1, 1, 1)
    b = collate(rep.samples, pad_id=0)
    assert b["loss_mask"][0].tolist() == [0, 0, 0, 1, 0, 0, 1]  # prompt and the two tool tokens excluded
    assert b["old_logp"][0].tolist() == [0, 0, 0, -1, -1, -1, -1] and b["weights"].tolist() == [0.5]
    assert samples_from_groups([g], max_len=5).skipped_too_long == 1


def test_micro_batches_respect_the_token_budget(tiny: tuple) -> None:
    samples = samples_from_groups(tiny[2]).samples
    for mb in micro_batches(samples, 64):
        width = max(len(s.ids) for s in mb)
        assert len(mb) == 1 or width * len(mb) <= 64
    assert sum(len(mb) for mb in micro_batches(samples, 64)) == len(samples)


def test_bf16_mixed_keeps_float32_weights_and_state_and_steps_near_the_float32_step(tiny: tuple) -> None:
    """--precision bf16-mixed: the forward passes under bfloat16 autocast, the weights, gradients and AdamW's
    state in float32; its gradient is the float32 one to bfloat16's precision, not another step."""
    base, tok, groups = tiny
    samples = samples_from_groups(groups).samples
    grads, dtypes = [], []
    for autocast in (None, torch.bfloat16):
        model = copy.deepcopy(base)
        backend = TorchGRPOBackend(model, grpo=GRPOConfig(loss_agg="dapo"), micro_batch_tokens=512, pad_id=tok.pad_id,
                                   autocast=autocast)
        backend.accumulate(samples)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
        backend.optimizer.step()
        dtypes.append({p.dtype for p in model.parameters()} | {p.grad.dtype for p in model.parameters() if p.grad is not None}
                      | {v.dtype for s in backend.optimizer.state.values() for k, v in s.items() if k != "step"})
    assert dtypes == [{torch.float32}, {torch.float32}]
    rel = float((grads[1] - grads[0]).norm() / grads[0].norm())
    assert 0.0 < rel < 0.1, rel


def test_a_group_s_shared_prompt_computed_once_gives_the_step_of_whole_rows(tiny: tuple) -> None:
    """Each micro-batch's shared prompt runs once (policy and reference); the loss and gradient are those of running
    every row whole, and the forward passes run over fewer positions."""
    base, tok, _ = tiny
    samples = samples_from_groups(prompt_groups(len(tok), n_groups=3, group_size=4, prompt_tokens=128, response_tokens=8)).samples
    runs = []
    for share in (False, True):
        model = copy.deepcopy(base)
        backend = TorchGRPOBackend(model, grpo=GRPOConfig(loss_agg="grpo", kl_beta=0.1), micro_batch_tokens=4096, pad_id=tok.pad_id,
                                   ref_model=copy.deepcopy(base), share_prefix=share)
        backend.optimizer.step()  # the reference and the policy differ a little, so the KL term has a gradient
        m = backend.accumulate(samples)
        runs.append((m, torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])))
    (whole, g_whole), (shared, g_shared) = runs
    assert shared["loss"] == pytest.approx(whole["loss"], abs=1e-6)
    assert torch.allclose(g_shared, g_whole, atol=1e-6, rtol=1e-4)
    assert shared["tokens"] == whole["tokens"] and shared["tokens_computed"] < 0.75 * whole["tokens_computed"]
    # with the top layer trained, the reference's frozen lower layer comes from the policy's forward: the same step
    runs = []
    for share in (False, True):
        model = copy.deepcopy(base)
        train_top_layers(model, 1)
        frozen = TorchGRPOBackend(model, grpo=GRPOConfig(kl_beta=0.5), lr=1e-2, pad_id=tok.pad_id, ref_model=copy.deepcopy(base),
                                  share_prefix=share)
        frozen.step(prompt_groups(len(tok), n_groups=2, group_size=4, prompt_tokens=30, response_tokens=8, seed=3))
        m = frozen.accumulate(samples)
        runs.append((frozen.shared_layers, m["kl"], torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])))
    (none, kl_whole, g_whole), (one, kl_shared, g_shared) = runs
    assert (none, one) == (0, 1) and kl_whole > 0 and kl_shared == pytest.approx(kl_whole, rel=1e-5)
    assert torch.allclose(g_shared, g_whole, atol=1e-6, rtol=1e-4)
    # below break-even for a model this small (4 x 48-token prompts ran at 0.78x the tokens per CPU-second): whole rows
    short = samples_from_groups(prompt_groups(len(tok), n_groups=3, group_size=4, prompt_tokens=48, response_tokens=8)).samples
    assert backend.share_prefix and not any(prefix for prefix, _ in backend.pack(short))


def test_shared_batches_group_rows_by_what_they_share_and_respect_the_budget() -> None:
    prompt_a, prompt_b = list(range(1, 41)), list(range(100, 130))
    samples = [Sample(p + r, [0] * len(p) + [1] * len(r), None, 0.0) for p in (prompt_a, prompt_b) for r in ([7, 8], [9], [7, 9, 9])]
    samples.append(Sample(list(range(200, 205)) + [1, 2], [0] * 5 + [1, 1], None, 0.0))  # shares nothing
    samples.append(Sample(prompt_a[:20] + [5, 5, 5] + [0, 6], [0] * 20 + [1, 0, 1] + [0, 1], None, 0.0))  # multi-turn: mask gaps
    packed = shared_batches(samples, 4096, min_saved=0)
    assert sorted(id(s) for _, mb in packed for s in mb) == sorted(id(s) for s in samples)
    for prefix, mb in packed:
        if prefix:
            assert len(mb) > 1 and all(s.ids[:prefix] == mb[0].ids[:prefix] and prefix <= first_scored(s) for s in mb)
    # the 40-token prompt's rows share 39 among themselves (saving 78), 19 with the multi-turn row (saving 57): it goes alone
    assert sorted(p for p, _ in packed) == [0, 29, 39]
    assert sorted(p for p, _ in shared_batches(samples, 4096, min_saved=60)) == [0, 39]  # 2 x 29 saves too little: those rows go with the lone ones
    for prefix, mb in shared_batches(samples, 60, min_saved=0):
        width = max(len(s.ids) for s in mb)
        assert len(mb) == 1 or prefix + len(mb) * (width - prefix) <= 60


def test_a_model_mixing_layer_types_runs_its_reference_whole(tiny: tuple) -> None:
    """What the decoder hands one layer is not what it hands the others where layer types differ (sliding-window and full
    attention): the reference's upper layers are not run from the policy's layer inputs there."""
    base, tok, _ = tiny
    model = copy.deepcopy(base)
    train_top_layers(model, 1)
    assert shared_lower_layers(model, copy.deepcopy(base)) == 1
    model.config.layer_types = ["sliding_attention", "full_attention"]
    assert shared_lower_layers(model, copy.deepcopy(base)) == 0


def test_a_steps_metrics_carry_the_batchs_reward_and_success(tiny: tuple) -> None:
    """Each step reports its batch's mean final reward and success rate (final reward > 0, as the export's
    rollouts/success counts it): the trackers' train/reward_mean and train/success_rate."""
    from trainer.torch_backend import group_stats

    _base, _tok, groups = tiny
    rewards = [r for g in groups for r in g.rewards]
    stats = group_stats(groups)
    assert stats["success_rate"] == pytest.approx(sum(r > 0 for r in rewards) / len(rewards))
    assert stats["reward_mean"] == pytest.approx(sum(rewards) / len(rewards)) and 0.0 <= stats["success_rate"] <= 1.0
    assert group_stats([])["success_rate"] == 0.0


def _weights(model: object) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])  # type: ignore[attr-defined]


def _with_logprobs(groups: list[GroupBatch], model: object | None) -> list[GroupBatch]:
    """The groups with each response's sampling log-probs: ``model``'s own now, or none recorded (None)."""
    return [g.model_copy(update={"transitions": [
        t.model_copy(update={"response_logprobs": [] if model is None else sequence_logprobs(model, t.prompt_token_ids, t.response_token_ids)})
        for t in g.transitions]}) for g in groups]


def test_updates_per_batch_are_that_many_steps_on_the_batch_each_clipped_against_its_sampling(tiny: tuple) -> None:
    """GRPO's μ (verl's ppo_epochs): three updates on one batch are the three steps one would take on it one after
    another, every one clipped against the log-probs the batch was sampled with; one step's metrics are the first
    update's, and the last one's clip fraction and ratio say how far the updates moved from the sampling policy."""
    base, tok, groups = tiny
    assert all(t.response_logprobs for g in groups for t in g.transitions), "sampled with their log-probs"
    cfg = GRPOConfig(loss_agg="grpo", clip_eps=0.1)
    once, thrice = copy.deepcopy(base), copy.deepcopy(base)
    b1 = TorchGRPOBackend(once, grpo=cfg, lr=3e-3, micro_batch_tokens=512, pad_id=tok.pad_id)
    b3 = TorchGRPOBackend(thrice, grpo=cfg, lr=3e-3, micro_batch_tokens=512, pad_id=tok.pad_id, updates_per_batch=3)
    steps = [b1.step(groups) for _ in range(3)]
    m = b3.step(groups)
    assert torch.allclose(_weights(once), _weights(thrice), atol=1e-6, rtol=1e-5)
    assert m["updates"] == 3.0 and m["loss"] == pytest.approx(steps[0]["loss"], abs=1e-6)
    assert m["clip_fraction_last"] == pytest.approx(steps[2]["clip_fraction"], abs=1e-6) and m["clip_fraction_last"] > 0
    assert m["ratio_mean_last"] == pytest.approx(steps[2]["ratio_mean"], abs=1e-5) and m["ratio_mean_last"] != 1.0
    assert "updates" not in steps[0], "one update a batch reports as before"


def test_updates_on_a_batch_without_sampling_logprobs_clip_against_the_policy_before_the_first(tiny: tuple) -> None:
    """A batch that recorded no sampling log-probs: its later updates clip against the policy as it was before the
    first, as if the batch carried that policy's log-probs, not against the policy as it is at each update (whose
    ratio is always 1: no trust region)."""
    base, tok, groups = tiny
    cfg = GRPOConfig(loss_agg="grpo", clip_eps=0.1, kl_beta=0.05)
    without, filled = copy.deepcopy(base), copy.deepcopy(base)
    ref = copy.deepcopy(base)  # the KL reference's log-probs, computed at the first update, serve the second too
    b_without = TorchGRPOBackend(without, grpo=cfg, lr=3e-3, micro_batch_tokens=64, pad_id=tok.pad_id, updates_per_batch=2,
                                 ref_model=ref)
    b_filled = TorchGRPOBackend(filled, grpo=cfg, lr=3e-3, micro_batch_tokens=64, pad_id=tok.pad_id, ref_model=ref)
    assert len(b_without.pack(samples_from_groups(groups).samples)) > 2, "the old log-probs of several micro-batches, in order"
    m = b_without.step(_with_logprobs(groups, None))
    as_sampled = _with_logprobs(groups, base)
    b_filled.step(as_sampled)
    second = b_filled.step(as_sampled)
    assert torch.allclose(_weights(without), _weights(filled), atol=1e-5, rtol=1e-4)
    assert m["ratio_mean"] == pytest.approx(1.0) and m["ratio_mean_last"] == pytest.approx(second["ratio_mean"], abs=1e-4)
    assert m["ratio_mean_last"] != pytest.approx(1.0, abs=1e-4)


def test_mini_batches_cut_a_batch_into_runs_of_whole_groups() -> None:
    from trainer.torch_backend import merge_mini_batches, mini_batch_cuts

    assert mini_batch_cuts(4, 2) == [(0, 2), (2, 4)] and mini_batch_cuts(5, 2) == [(0, 2), (2, 5)]
    assert mini_batch_cuts(2, 4) == [(0, 1), (1, 2)], "never more mini-batches than groups"
    assert mini_batch_cuts(3, 1) == [(0, 3)] and mini_batch_cuts(0, 3) == [(0, 0)]
    one = ({"loss": 0.5, "response_tokens": 3.0}, 0.7)
    assert merge_mini_batches([one]) is one
    a = {"loss": 0.2, "pg_loss": 0.1, "kl": 0.01, "clip_fraction": 0.0, "ratio_mean": 1.0, "ratio_max": 1.0, "ratio_min": 1.0,
         "micro_batches": 1.0, "response_tokens": 10.0, "tokens": 50.0, "tokens_computed": 60.0, "samples": 4.0}
    b = {**a, "loss": 0.4, "kl": 0.04, "clip_fraction": 0.3, "ratio_mean": 1.1, "ratio_max": 1.5, "ratio_min": 0.8,
         "response_tokens": 30.0, "samples": 5.0}
    m, norm = merge_mini_batches([(a, 1.0), (b, 3.0)])
    assert (m["loss"], norm) == (pytest.approx(0.3), 2.0), "each mini-batch's mean, averaged"
    assert (m["kl"], m["clip_fraction"]) == (pytest.approx(0.0325), pytest.approx(0.225)), "token means by response tokens"
    assert (m["samples"], m["tokens"], m["response_tokens"], m["ratio_max"], m["ratio_min"]) == (9.0, 100.0, 40.0, 1.5, 0.8)


@pytest.mark.parametrize("updates", [1, 2])
def test_mini_batches_are_one_step_per_run_of_groups_each_clipped_against_its_sampling(tiny: tuple, updates: int) -> None:
    """verl's mini-batches (train_batch_size / ppo_mini_batch_size): two mini-batches are the steps one would take on
    the batch's first two groups, then its last two (and again, with two passes); the step reports its first pass's
    losses averaged, its counts summed, and the last update's ratio to the sampling policy."""
    base, tok, groups = tiny
    assert len(groups) == 4 and all(t.response_logprobs for g in groups for t in g.transitions)
    cfg = GRPOConfig(loss_agg="grpo", clip_eps=0.1)
    seq, mini = copy.deepcopy(base), copy.deepcopy(base)
    b1 = TorchGRPOBackend(seq, grpo=cfg, lr=3e-3, micro_batch_tokens=512, pad_id=tok.pad_id)
    b2 = TorchGRPOBackend(mini, grpo=cfg, lr=3e-3, micro_batch_tokens=512, pad_id=tok.pad_id, mini_batches=2,
                          updates_per_batch=updates)
    steps = [b1.step(half) for _ in range(updates) for half in (groups[:2], groups[2:])]
    m = b2.step(groups)
    assert torch.allclose(_weights(seq), _weights(mini), atol=1e-6, rtol=1e-5)
    assert m["mini_batches"] == 2.0 and m["updates"] == 2.0 * updates
    assert m["samples"] == steps[0]["samples"] + steps[1]["samples"] == 16
    assert m["loss"] == pytest.approx((steps[0]["loss"] + steps[1]["loss"]) / 2, abs=1e-6)
    assert m["ratio_max"] == pytest.approx(max(steps[0]["ratio_max"], steps[1]["ratio_max"]), abs=1e-6)
    assert m["ratio_mean_last"] == pytest.approx(steps[-1]["ratio_mean"], abs=1e-5) and m["ratio_mean_last"] != 1.0
    assert m["clip_fraction_last"] == pytest.approx(steps[-1]["clip_fraction"], abs=1e-6)
    assert "mini_batches" not in steps[0] and "updates" not in steps[0], "one step a batch reports as before"


def test_a_nonfinite_gradient_in_a_later_mini_batch_keeps_the_earlier_step_and_says_so(tiny: tuple, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The second mini-batch's gradient is not finite: its step and the batch's later ones are skipped, the first's
    stays (the weights are one step on the first half), and the metrics say both."""
    base, tok, groups = tiny
    seq, mini = copy.deepcopy(base), copy.deepcopy(base)
    b1 = TorchGRPOBackend(seq, grpo=GRPOConfig(), lr=3e-3, micro_batch_tokens=512, pad_id=tok.pad_id)
    b2 = TorchGRPOBackend(mini, grpo=GRPOConfig(), lr=3e-3, micro_batch_tokens=512, pad_id=tok.pad_id, mini_batches=2,
                          updates_per_batch=2)
    b1.step(groups[:2])
    clip, calls = torch.nn.utils.clip_grad_norm_, []

    def second_is_nan(params, max_norm):  # type: ignore[no-untyped-def]
        calls.append(1)
        norm = clip(params, max_norm)
        return norm if len(calls) != 2 else torch.tensor(float("nan"))

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", second_is_nan)
    m = b2.step(groups)
    assert len(calls) == 2 and m["skipped_nonfinite"] == 1.0 and m["updates"] == 1.0
    assert torch.allclose(_weights(seq), _weights(mini), atol=1e-6, rtol=1e-5)
    assert m["tokens_per_s"] > 0 and m["samples"] == 16


def test_mini_batches_of_a_batch_without_sampling_logprobs_clip_against_the_policy_before_the_first(tiny: tuple) -> None:
    """A batch that recorded no sampling log-probs: its second mini-batch clips against the policy before the batch's
    first step (a forward pass before it, as verl computes the old log-probs once), as if the batch carried them; not
    against the policy after the first step (ratio 1: each mini-batch would be plain on-policy)."""
    base, tok, groups = tiny
    cfg = GRPOConfig(loss_agg="grpo", clip_eps=0.1, kl_beta=0.05)
    without, filled = copy.deepcopy(base), copy.deepcopy(base)
    ref = copy.deepcopy(base)
    b_without = TorchGRPOBackend(without, grpo=cfg, lr=3e-3, micro_batch_tokens=64, pad_id=tok.pad_id, mini_batches=2,
                                 ref_model=ref)
    b_filled = TorchGRPOBackend(filled, grpo=cfg, lr=3e-3, micro_batch_tokens=64, pad_id=tok.pad_id, ref_model=ref)
    m = b_without.step(_with_logprobs(groups, None))
    as_sampled = _with_logprobs(groups, base)
    b_filled.step(as_sampled[:2])
    second = b_filled.step(as_sampled[2:])
    assert torch.allclose(_weights(without), _weights(filled), atol=1e-5, rtol=1e-4)
    assert m["ratio_mean_last"] == pytest.approx(second["ratio_mean"], abs=1e-4)
    assert m["ratio_mean_last"] != pytest.approx(1.0, abs=1e-4)
    # the decoupled loss takes mini-batches (each sample is used once a pass): no trust region is asked of it
    TorchGRPOBackend(copy.deepcopy(base), grpo=GRPOConfig(policy_loss="decoupled"), pad_id=tok.pad_id, mini_batches=2)


def test_several_updates_a_batch_refuse_the_decoupled_loss(tiny: tuple) -> None:
    from foundation.errors import TrainingError
    from trainer.settings import TrainerSettings

    base, tok, _groups = tiny
    with pytest.raises(TrainingError, match="no trust region"):
        TorchGRPOBackend(copy.deepcopy(base), grpo=GRPOConfig(policy_loss="decoupled"), pad_id=tok.pad_id, updates_per_batch=2)
    with pytest.raises(ValueError, match="2 updates a batch need a policy loss that clips.*not decoupled"):
        TrainerSettings(updates_per_batch=2, policy_loss="decoupled")
    assert TrainerSettings(updates_per_batch=2).updates_per_batch == 2 and TrainerSettings().updates_per_batch == 1


def test_rolloutbus_train_refuses_several_updates_with_the_decoupled_loss_in_one_line() -> None:
    """The rule over two flags is one line that names neither settings class (the CLI reads SFT's, a subclass)."""
    import argparse

    from foundation.errors import SettingError
    from trainer.cli import add_arguments, settings_from_args

    p = argparse.ArgumentParser()
    add_arguments(p)
    with pytest.raises(SettingError) as exc:
        settings_from_args(p.parse_args(["--updates-per-batch", "2", "--policy-loss", "decoupled"]))
    assert str(exc.value).startswith("settings that do not go together: 2 updates a batch need a policy loss that clips")
    assert "Settings" not in str(exc.value)
    assert settings_from_args(p.parse_args(["--updates-per-batch", "2"])).updates_per_batch == 2
