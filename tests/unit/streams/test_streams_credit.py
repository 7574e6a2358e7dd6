import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.credit import returns

rewards_ = st.lists(st.floats(-10, 10, allow_nan=False), min_size=0, max_size=12)
final_ = st.floats(-10, 10, allow_nan=False)


def test_examples():
    assert returns([0.0, 0.0, 0.0], 1.0, "identical") == [1.0, 1.0, 1.0]
    assert returns([0.5, 0.0], 1.0, "discounted", 0.5) == pytest.approx([0.5 + 0.5 * 1.0, 1.0])
    assert returns([0.5, -0.1], 1.0, "per-turn") == pytest.approx([0.5, 0.9])
    assert returns([], 1.0, "discounted", 0.9) == []


@given(n=st.integers(0, 12), final=final_)
def test_gamma_one_without_intermediate_rewards_is_identical(n, final):
    assert returns([0.0] * n, final, "discounted", 1.0) == pytest.approx(returns([0.0] * n, final, "identical"))


@given(r=rewards_, final=final_)
def test_sums_and_limits(r, final):
    total = math.fsum(r) + (final if r else 0.0)
    disc1 = returns(r, final, "discounted", 1.0)
    per_turn = returns(r, final, "per-turn")
    assert sum(per_turn) == pytest.approx(total, abs=1e-9)
    if r:
        assert disc1[0] == pytest.approx(total, abs=1e-9)
        assert returns(r, final, "identical") == pytest.approx([total] * len(r), abs=1e-9)
        assert disc1[-1] == pytest.approx(per_turn[-1])
    assert returns(r, final, "discounted", 0.0) == pytest.approx(per_turn)


@given(r=st.lists(st.floats(0, 10, allow_nan=False), min_size=1, max_size=12), g=st.floats(0, 1))
def test_non_negative_rewards_give_returns_bounded_by_the_undiscounted_ones(r, g):
    disc = returns(r, 0.0, "discounted", g)
    undiscounted = returns(r, 0.0, "discounted", 1.0)
    assert all(0 <= d <= u + 1e-9 for d, u in zip(disc, undiscounted))


def test_bad_mode_or_gamma():
    from foundation.errors import ConfigError

    with pytest.raises(ConfigError, match="credit mode 'monte-carlo' is not one of: identical, discounted, per-turn"):
        returns([0.0], 1.0, "monte-carlo")
    with pytest.raises(ValueError, match="gamma"):
        returns([0.0], 1.0, "discounted", 1.5)
