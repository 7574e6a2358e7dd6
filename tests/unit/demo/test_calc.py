"""The demo task's pure parts: problems, the calculator, the checker, the demonstrations."""

from __future__ import annotations

import random

import pytest

from rolloutbus.demo import calc


@pytest.mark.parametrize(
    ("text", "expected"),
    [("5+3", (True, "8")), ("9*9", (True, "81")), ("2-7", (True, "-5")), ("-5*3", (True, "-15")),
     ("5+", (False, "cannot evaluate '5+': expected <int><op><int>")), ("x", (False, "cannot evaluate 'x': expected <int><op><int>"))],
)
def test_calculator(text: str, expected: tuple[bool, str]) -> None:
    assert calc.calculator(text) == expected


@pytest.mark.parametrize(
    ("text", "move"),
    [("calc 5+3", ("calc", "5+3")), ("answer 16", ("answer", "16")), ("answer -4", ("answer", "-4")),
     ("calc 5 plus 3", ("calc", "5 plus 3")), ("hello", ("invalid", "hello"))],
)
def test_parse_action(text: str, move: tuple[str, str]) -> None:
    assert calc.parse_action(text) == move


def test_answers_fold_left() -> None:
    assert calc.Problem((5, 3), ("gain",)).answer == 8
    assert calc.Problem((5, 3, 2), ("gain", "times")).answer == 16
    assert calc.Problem((2, 7), ("less",)).answer == -5
    p = calc.Problem((4, 6), ("each",))
    assert calc.Problem.from_json(p.to_json()) == p
    assert calc.check(p, "24") == 1.0 and calc.check(p, "10") == 0.0 and calc.check(p, None) == 0.0


def test_split_is_disjoint_and_covers_the_space() -> None:
    train, test = calc.split(calc.problem_space(1) - 150, 150, seed=3)
    assert len(test) == 150 and not set(train) & set(test)
    assert len(set(train) | set(test)) == calc.problem_space(1) == 486
    with pytest.raises(ValueError, match="distinct"):
        calc.problems(487, seed=0)


def test_demonstrations_are_consistent_and_hold_the_misconceptions() -> None:
    rng = random.Random(0)
    problem = calc.Problem((5, 3), ("more",))
    convs = [calc.demonstration(problem, rng) for _ in range(600)]
    ops: dict[str, int] = {}
    for conv in convs:
        assert [m["role"] for m in conv] == ["user", "assistant", "tool", "assistant"]
        ok, result = calc.calculator(conv[1]["content"].removeprefix("calc "))
        assert ok and conv[2]["content"] == result and conv[3]["content"] == f"answer {result}"
        op = conv[1]["content"][6]
        ops[op] = ops.get(op, 0) + 1
    # "more" means +, but the warm-up mostly teaches -: the starting policy's favourite is wrong.
    assert max(ops, key=ops.__getitem__) == "-" and 0.2 < ops["+"] / 600 < 0.4
    assert calc.warmup_distribution("gain") == {"+": 0.6, "-": 0.2, "*": 0.2}
    pairs = calc.sft_pairs(convs[:2])
    assert len(pairs) == 4 and pairs[0][1].startswith("calc ") and pairs[1][0][-1]["role"] == "tool"
