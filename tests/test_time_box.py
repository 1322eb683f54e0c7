"""make check's time box (tests/time_box.py): the edited test files whole, then the cheapest of
the rest that fit, a file's shared setup charged once, and what was left out counted."""

from __future__ import annotations

import json

from tests import time_box


def test_edited_files_run_whole_and_the_cheapest_others_fill_the_box():
    ids = ["tests/test_a.py::slow", "tests/test_a.py::quick", "tests/test_b.py::one", "tests/test_b.py::two",
           "tests/test_edit.py::long"]
    record = {"tests/test_a.py::slow": [0.0, 50.0], "tests/test_a.py::quick": [0.0, 1.0],
              "tests/test_b.py::one": [0.0, 3.0], "tests/test_b.py::two": [0.0, 4.0],
              "tests/test_edit.py::long": [0.0, 30.0]}
    boxed = time_box.choose(ids, record, ["tests/test_edit.py"], box_s=36)
    assert boxed.kept == ["tests/test_a.py::quick", "tests/test_b.py::one", "tests/test_edit.py::long"]
    assert boxed.kept_s == 34.0
    assert boxed.left == ["tests/test_b.py::two", "tests/test_a.py::slow"] and boxed.left_s == 54.0
    whole = time_box.choose(ids, record, [], box_s=1000)
    assert whole.kept == ids and not whole.left, "everything fits a large box, in collection order"


def test_a_files_shared_setup_is_charged_once_whichever_test_runs_first():
    """A module fixture (a server) was paid by the first test of the file last time; a box that
    keeps only a later test pays it there."""
    ids = ["tests/test_s.py::first", "tests/test_s.py::second", "tests/test_s.py::third"]
    record = {"tests/test_s.py::first": [20.0, 5.0], "tests/test_s.py::second": [0.1, 1.0],
              "tests/test_s.py::third": [0.1, 1.0]}
    boxed = time_box.choose(ids, record, [], box_s=23)
    assert boxed.kept == ["tests/test_s.py::second", "tests/test_s.py::third"]
    assert round(boxed.kept_s, 1) == 22.2, "20 s of shared setup once, plus each test's own"
    assert boxed.left == ["tests/test_s.py::first"] and boxed.left_s == 5.0


def test_a_test_never_run_is_costed_at_the_unknown_estimate(tmp_path):
    boxed = time_box.choose(["tests/test_new.py::t"], {}, [], box_s=time_box.UNKNOWN_S - 0.5)
    assert boxed.left == ["tests/test_new.py::t"] and boxed.left_s == time_box.UNKNOWN_S
    path = time_box.record_path(tmp_path)
    assert time_box.read_record(tmp_path) == {}, "no record yet"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"tests/test_x.py::t": [0.5, 2], "broken": "x"}))
    assert time_box.read_record(tmp_path) == {"tests/test_x.py::t": [0.5, 2.0]}
    path.write_text("{not json")
    assert time_box.read_record(tmp_path) == {}
    assert time_box.merged({"a": [1.0, 1.0], "b": [2.0, 2.0]}, {"b": [3.0, 3.0]}) == {"a": [1.0, 1.0], "b": [3.0, 3.0]}


def test_a_test_file_that_does_not_import_gets_no_box_and_its_error_is_shown(tmp_path, capsys):
    """scripts/changed_tests.py: collecting fails, so the keep file of an earlier run is removed
    (pytest then runs every selected file and reports the error) and the reason is said."""
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "changed_tests.py"
    spec = importlib.util.spec_from_file_location("changed_tests", script)
    assert spec is not None and spec.loader is not None
    changed_tests = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(changed_tests)
    broken = tmp_path / "test_broken.py"
    broken.write_text("from amlhpc.jobs.runtime.base import contract\n\nassert contract.NO_SUCH_NAME\n\n\n"
                      "def test_x():\n    pass\n")
    keep = tmp_path / "keep.txt"
    keep.write_text("tests/test_old.py::test_from_an_earlier_run\n")
    changed_tests.box([str(broken)], {str(broken)}, 60, 2, keep, "not alone")
    assert not keep.exists(), "a stale keep file would run an earlier selection"
    assert "collecting the selected tests failed" in capsys.readouterr().err


def test_the_workers_take_the_files_longest_first_each_files_tests_in_order():
    """A long file started last runs alone at the end of `make test`: files go longest first,
    one never timed costs UNKNOWN_S per test."""
    record = {"tests/test_short.py::a": [0.0, 1.0], "tests/test_short.py::b": [0.0, 1.0],
              "tests/test_long.py::only": [10.0, 30.0]}
    seconds = time_box.file_seconds(record)
    assert seconds == {"tests/test_long.py": 40.0, "tests/test_short.py": 2.0}
    ids = ["tests/test_short.py::a", "tests/test_new.py::x", "tests/test_new.py::y", "tests/test_short.py::b",
           "tests/test_long.py::only"]
    assert time_box.longest_first(ids, seconds) == [
        "tests/test_long.py::only", "tests/test_new.py::x", "tests/test_new.py::y", "tests/test_short.py::a",
        "tests/test_short.py::b"]


def test_a_fresh_clone_orders_by_the_committed_times(tmp_path):
    """No local record (a fresh clone, CI): the committed file's times, which name real test files."""
    committed = time_box.weights(tmp_path)
    assert committed == json.loads(time_box.FILE_SECONDS.read_text())
    repo = time_box.FILE_SECONDS.parent.parent
    still_there = [name for name in committed if (repo / name).is_file()]
    assert len(still_there) >= 0.9 * len(committed), "refresh it: python -m tests.time_box --write"
    path = time_box.record_path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"tests/test_x.py::t": [1.0, 2.0]}))
    assert time_box.weights(tmp_path) == {"tests/test_x.py": 3.0}, "a local record wins"
