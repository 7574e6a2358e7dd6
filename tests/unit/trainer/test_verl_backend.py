"""GroupBatch → verl's actor layout (CPU). The DataProto test runs wherever verl is installed."""

from __future__ import annotations

import sys

import pytest

from schemas.models import GroupBatch, Transition
from trainer.verl_backend import to_verl_tensors, verl_available


def _group() -> GroupBatch:
    t1 = Transition(rollout_id="a", attempt_id="a1", task_id="t", span_id="s1", turn=0, prompt_token_ids=[1, 4, 9],
                    response_token_ids=[10, 11, 7], response_logprobs=[-0.5, -1.0, -0.25], response_mask=[1, 0, 1], advantage=1.5)
    t2 = Transition(rollout_id="b", attempt_id="b1", task_id="t", span_id="s2", turn=0, prompt_token_ids=[1, 4],
                    response_token_ids=[12], response_logprobs=[-2.0], advantage=-1.5)
    return GroupBatch(group_id="g", task_id="t", created_ns=0, group_size=2, rollout_ids=["a", "b"], rewards=[1, 0],
                      advantages=[1.5, -1.5], transitions=[t1, t2])


def test_layout_left_padded_prompt_right_padded_response() -> None:
    x = to_verl_tensors([_group()], pad_id=0)
    assert x["input_ids"].tolist() == [[1, 4, 9, 10, 11, 7], [0, 1, 4, 12, 0, 0]]
    assert x["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 0, 0]]
    assert x["position_ids"].tolist() == [[0, 1, 2, 3, 4, 5], [0, 0, 1, 2, 2, 2]]
    assert x["responses"].tolist() == [[10, 11, 7], [12, 0, 0]]
    assert x["response_mask"].tolist() == [[1, 0, 1], [1, 0, 0]]  # tool token and padding excluded
    assert x["old_log_probs"].tolist() == [[-0.5, -1.0, -0.25], [-2.0, 0.0, 0.0]]
    assert x["advantages"].tolist() == [[1.5, 0.0, 1.5], [-1.5, 0.0, 0.0]]


def test_cpu_path_never_imports_verl_or_vllm() -> None:
    import trainer.cli, trainer.loop, trainer.serve  # noqa: F401, E401

    assert "verl" not in sys.modules and "vllm" not in sys.modules


@pytest.mark.skipif(not verl_available(), reason="verl is not installed (pip install -e '.[trainer,gpu]')")
def test_data_proto_from_groups() -> None:
    from trainer.verl_backend import to_data_proto

    dp = to_data_proto([_group()], pad_id=0, meta_info={"temperature": 1.0})
    assert dp.batch["responses"].shape == (2, 3) and list(dp.non_tensor_batch["uid"]) == ["g", "g"]
