"""`make test`'s parallel pass hands out the slowest test files first (tests/schedule.py), from a record of the seconds
each file took that a run writes with ``--record-durations``."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

from tests import schedule

ROOT = Path(__file__).resolve().parents[2]


def test_whole_files_go_slowest_first_and_unrecorded_ones_keep_their_place_after() -> None:
    ids = ["t/a.py::x", "t/a.py::y", "t/b.py::x", "t/c.py::x[1]", "t/c.py::x[2]", "t/d.py::x"]
    order = schedule.slowest_files_first(ids, {"t/c.py": 300.0, "t/b.py": 20.0})
    assert [ids[i] for i in order] == ["t/c.py::x[1]", "t/c.py::x[2]", "t/b.py::x", "t/a.py::x", "t/a.py::y", "t/d.py::x"]
    assert schedule.slowest_files_first(ids, {}) == list(range(len(ids)))


def test_a_run_replaces_the_figures_of_its_files_and_keeps_the_others() -> None:
    totals = schedule.total_by_file([("t/a.py::x", 4.0), ("t/a.py::x", 3.0), ("t/b.py::y", 1.0), ("t/c.py::z", 9.04)])
    assert totals == {"t/a.py": 7.0, "t/b.py": 1.0, "t/c.py": 9.04}
    assert schedule.merged({"t/a.py": 100.0, "t/d.py": 50.0, "t/b.py": 30.0}, totals) == \
        {"t/a.py": 7.0, "t/c.py": 9.0, "t/d.py": 50.0}  # b ran quicker than the record's floor: dropped


def test_the_committed_record_names_files_that_exist() -> None:
    recorded = schedule.read(schedule.RECORDED)
    assert recorded, "tests/durations.json is empty or missing"
    gone = [f for f in recorded if not (ROOT / f).is_file()]
    assert not gone, f"tests/durations.json names files that are gone (refresh it, tests/schedule.py says how): {gone}"


SLOW, QUICK = "import time\ndef test_slow(): time.sleep(0.3)\n", "def test_one(): pass\ndef test_two(): pass\n"


def test_a_recorded_run_orders_the_next_one_in_the_workers(tmp_path: Path) -> None:
    probe = ROOT / "tests" / "unit" / f"_order_probe_{uuid.uuid4().hex[:8]}"
    probe.mkdir()
    record = tmp_path / "durations.json"
    try:
        (probe / "test_a_quick.py").write_text(QUICK)
        (probe / "test_b_slow.py").write_text(SLOW)
        rel = probe.relative_to(ROOT)
        args = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-n", "1", "--dist", "loadfile",
                "--no-loadscope-reorder", str(rel)]
        env = {**os.environ, schedule.ENV: str(record)}

        def ran(*extra: str) -> list[str]:
            r = subprocess.run([*args, *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stdout + r.stderr
            return re.findall(r"PASSED (\S+)", r.stdout)

        assert [Path(p).name for p in ran()] == ["test_a_quick.py::test_one", "test_a_quick.py::test_two",
                                                  "test_b_slow.py::test_slow"]
        record.write_text(json.dumps({f"{rel}/test_b_slow.py": 10.0}))
        assert [Path(p).name for p in ran()] == ["test_b_slow.py::test_slow", "test_a_quick.py::test_one",
                                                  "test_a_quick.py::test_two"]
        record.write_text(json.dumps({f"{rel}/test_b_slow.py": 10.0, "tests/elsewhere.py": 60.0}))
        ran("--record-durations", str(record))
        # the slow file ran under the floor (5 s) this time: its entry goes; a file this run did not run keeps its own
        assert json.loads(record.read_text()) == {"tests/elsewhere.py": 60.0}
    finally:
        shutil.rmtree(probe)
