import pytest

from streams.assembly import assemble, missing_ids
from tests.unit.streams.spans import span


def test_orders_by_sequence_id_not_arrival():
    traj = assemble([span(3), span(1), span(2)])
    assert [s.sequence_id for s in traj.spans] == [1, 2, 3]
    assert traj.complete and traj.duplicates == 0


def test_duplicate_span_ids_are_kept_once():
    traj = assemble([span(1), span(2), span(1), span(2, name="again")])
    assert [s.sequence_id for s in traj.spans] == [1, 2]
    assert traj.duplicates == 2
    assert traj.spans[1].name == "s2"  # the first delivery wins


def test_gaps_are_visible_including_a_missing_tail():
    traj = assemble([span(1), span(4)], span_count=6)
    assert traj.missing_sequence_ids == [2, 3, 5, 6]
    assert not traj.complete


def test_missing_ids_edge_cases():
    assert missing_ids([], None) == []
    assert missing_ids([], 2) == [1, 2]
    assert missing_ids([0, 1, 2]) == []


def test_refuses_spans_of_two_attempts():
    with pytest.raises(ValueError, match="one attempt at a time"):
        assemble([span(1), span(2, att="a2")])
