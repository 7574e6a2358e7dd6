"""Span and trace ids: 16 / 32 lowercase hex digits, never repeated, by threads or by a forked child."""

from __future__ import annotations

import os
import re
import threading

from producers.spans import new_span_id, new_trace_id

SPAN_ID = re.compile(r"[0-9a-f]{16}")


def test_ids_are_otel_shaped_and_distinct() -> None:
    ids = [new_span_id() for _ in range(5000)]  # several pools' worth
    assert all(SPAN_ID.fullmatch(i) for i in ids)
    assert len(set(ids)) == len(ids)
    assert re.fullmatch(r"[0-9a-f]{32}", new_trace_id())


def test_threads_never_get_the_same_id() -> None:
    got: list[list[str]] = [[] for _ in range(4)]

    def draw(out: list[str]) -> None:
        for _ in range(3000):
            out.append(new_span_id())

    threads = [threading.Thread(target=draw, args=(out,)) for out in got]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [i for out in got for i in out]
    assert len(set(every)) == len(every) == 12000


def test_a_forked_child_draws_other_ids_than_its_parent() -> None:
    new_span_id()  # a pool is drawn: the child inherits it and the generator's state
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, then exit without running the test session's teardown
        os.close(r)
        os.write(w, ("".join(new_span_id() for _ in range(20)) + new_trace_id()).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        child = f.read().decode()
    os.waitpid(pid, 0)
    parent = "".join(new_span_id() for _ in range(20)) + new_trace_id()
    child_ids = {child[i:i + 16] for i in range(0, 320, 16)}
    parent_ids = {parent[i:i + 16] for i in range(0, 320, 16)}
    assert len(child) == len(parent) == 352
    assert not child_ids & parent_ids
    assert child[320:] != parent[320:]
