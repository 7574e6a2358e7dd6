"""``emit_*``'s attribute fast path against :func:`producers.spans.to_attr`, its reference."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from producers.emit import _attr
from producers.spans import to_attr

values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.binary(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@given(values)
def test_attr_is_to_attr(value: object) -> None:
    assert _attr(value) == to_attr(value)
