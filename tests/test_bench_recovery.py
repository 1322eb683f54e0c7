"""bench/recovery.py's reading of its runs: the checks it states and the table it writes,
from rows of the shape it measures (the benchmark itself runs behind `make bench`)."""

from __future__ import annotations

from bench import recovery


def row(name: str, **extra) -> dict:
    base = {"scenario": name, "state": "succeeded", "attempts": 2, "causes": ["preempted", "completed"], "seconds": 60.0,
            "missing": [], "max_running": 1, "controllers": ["c"], "lost_s": 12.0, "cost_lost_usd": 0.18,
            "unsupervised": "-", "stragglers": []}
    return {**base, **extra}


def test_checks_pass_and_fail_on_what_they_state():
    good = [row("hang", verdict_s=12.5), row("kill-watch", controllers=["a", "b"]), row("straggler", named=[1]),
            row("budget", total_usd=recovery.LIMIT_USD + 1, one_poll_usd=2.0)]
    assert all(ok for _, ok in recovery.checks(good))
    bad = [row("hang", verdict_s=20.0), row("kill-watch", controllers=["a"]), row("straggler", named=[0, 1]),
           row("budget", total_usd=recovery.LIMIT_USD + 5, one_poll_usd=2.0), row("preempt", missing=["preempt on node 1"], max_running=2)]
    failed = {text.split(":")[0] for text, ok in recovery.checks(bad) if not ok}
    assert len(failed) == 6, failed


def test_the_model_is_compared_with_the_measured_losses():
    rows = [row("preempt", detect_s=2.0, restart_s=8.0, lost_s=10.0, steps_lost=0),
            row("hang", detect_s=12.0, restart_s=8.0, lost_s=20.0, steps_lost=0)]
    model = recovery.validate_model(rows)
    assert model["recovery_s"] == 15.0 and model["predicted_loss_s"] == 15.0 + recovery.UPLOAD_INTERVAL_S / 2
    assert model["measured_loss_s"] == 15.0 and model["ratio"] == round(15.0 / model["predicted_loss_s"], 2)


def test_the_section_replaces_only_itself(tmp_path, monkeypatch):
    results = {"command": "python -m bench.recovery", "date": "today", "price": 27.197, "machine": "m",
               "load_before": "1", "load_after": "2", "rows": [row("preempt", detect_s=1.5, restart_s=7.0, steps_lost=0)],
               "checks": [("never two attempts at once", True)], "model": {}}
    target = tmp_path / "RESULTS.md"
    after = "<!-- bench.checkpoint: begin -->\n# Checkpoints and recovery\n\nkept too\n<!-- bench.checkpoint: end -->\n\n# Scale\n"
    target.write_text(f"# Staging benchmark\n\nkept\n\n# Recovery benchmark\n\nold table\n\n{after}")
    monkeypatch.setattr(recovery, "RESULTS", target)
    text = recovery.write(results, tmp_path / "out", update=True)
    written = target.read_text()
    assert written.startswith(f"# Staging benchmark\n\nkept\n\n{recovery.BEGIN}\n# Recovery benchmark") and "old table" not in written
    assert written.endswith(f"{recovery.END}\n\n{after}"), "the sections after it are kept (they were cut off before)"
    assert "| preempt | succeeded | 2 (preempted, completed) | 1.5 | 7.0 | 0 |" in text
    assert "- never two attempts at once: **met**" in text
    hand = written.replace(f"{recovery.END}\n", f"{recovery.END}\n\nhand-kept notes\n")
    target.write_text(hand)
    recovery.write({**results, "date": "tomorrow"}, tmp_path / "out", update=True)
    again = target.read_text()
    assert again.count(recovery.BEGIN) == 1 and "tomorrow" in again and "today" not in again
    assert again.endswith(f"{recovery.END}\n\nhand-kept notes\n\n{after}"), "between its markers only"


def test_each_figure_is_the_median_of_its_runs_with_the_spread():
    runs = [row("preempt", detect_s=d, restart_s=r, lost_s=d + r, repeat=i, load=f"{i}.00 0 0")
            for i, (d, r) in enumerate(((2.0, 8.0), (3.0, 9.0), (10.0, 7.0)), 1)]
    (summary,) = recovery.summarize(runs)
    assert (summary["detect_s"], summary["restart_s"], summary["runs"]) == (3.0, 8.0, 3)
    detect = summary["series"]["detect_s"]
    assert (detect["low"], detect["high"], detect["loads"]) == (2.0, 10.0, ["1.00 0 0", "2.00 0 0", "3.00 0 0"])
    results = {"command": "c", "date": "d", "price": 1.0, "machine": "m", "load_before": "1", "load_after": "2",
               "rows": [summary], "checks": [], "model": {}, "repeats": 3, "commit": "abc123", "runs": runs}
    table = recovery.render(results)
    assert "| 3.0 (2.0-10.0, n=3) | 8.0 (7.0-9.0, n=3) |" in table and "commit abc123" in table
    assert "The 1-minute load when the runs started: 1.00-3.00 (3 runs)." in table
    assert "a smoke run, not for publishing" in table, "fewer than 5 runs is said"


def test_a_check_holds_only_when_it_holds_on_every_run():
    runs = [row("straggler", named=[1]), row("straggler", named=[]), row("straggler", named=[1])]
    assert dict(recovery.checks(runs))["the slowed node is named, and only it"] is False


def test_repeats_and_restart_are_run(monkeypatch, tmp_path):
    """`--repeats N` runs each scenario N times, interleaved, each round on a new Azurite with the
    stack planned again; `--only restart` runs bench/restart.py."""
    import argparse
    import contextlib
    from types import SimpleNamespace

    from amlhpc.jobs.local import azurite
    from bench import restart
    from bench.spread import Series

    order: list[str] = []
    record = SimpleNamespace(attempts=[], total_usd=lambda _: 0.0)
    started: list[str] = []
    monkeypatch.setattr(azurite, "start", lambda path: started.append(path.name) or contextlib.nullcontext(
        SimpleNamespace(name=path.name)))
    worlds: list[str] = []
    monkeypatch.setattr(recovery, "Bench", lambda server, root: worlds.append(server.name) or SimpleNamespace(price=1.0))
    monkeypatch.setattr(recovery, "scenario", lambda name, bench: (order.append(name) or
                                                                   (SimpleNamespace(record=record, seconds=1.0), [])))
    monkeypatch.setattr(recovery, "measure", lambda name, done, bench, base: row(name, detect_s=float(len(order))))
    asked = {}

    def fake_restart(workdir, server, repeats, say=print):
        asked["repeats"] = repeats
        return {"crash": {"in_job_warm": Series("in_job_warm", [3.0, 4.0, 5.0])}}

    monkeypatch.setattr(restart, "measure", fake_restart)
    monkeypatch.setattr(recovery.tempfile, "mkdtemp", lambda prefix: str(tmp_path))  # its logs: not left in /tmp
    results = recovery.run(argparse.Namespace(only="baseline,preempt,restart", repeats=3))
    assert order == ["baseline", "preempt"] * 3 and asked == {"repeats": 3}
    # each round in a world of its own, as a rerun would be; the in-job restarts in one more
    assert worlds == ["azurite-1", "azurite-2", "azurite-3"] and started == [*worlds, "azurite-restart"]
    assert [r["runs"] for r in results["rows"]] == [3, 3] and results["rows"][1]["detect_s"] == 4.0
    assert results["restart"]["crash"]["in_job_warm"]["median"] == 4.0 and results["commit"]
    assert "| crash | in-job, warm standby ready | 4.00 (3.00-5.00, n=3) |" in recovery.render(results)


def test_repeats_must_be_positive(capsys):
    import pytest

    with pytest.raises(SystemExit) as exit_:
        recovery.main(["--repeats", "0"])
    assert exit_.value.code == 2 and "--repeats 0" in capsys.readouterr().err


def test_restart_ratios_are_taken_within_each_repeat():
    from bench import restart
    from bench.spread import Series

    series = {"resubmitted": Series("resubmitted", [20.0, 40.0, 36.0], ["1", "2", "3"]),
              "in_job_warm": Series("in_job_warm", [2.0, 8.0, 3.0], ["1", "2", "3"])}
    (ratio,) = restart.ratios(series, ("in_job_warm", "resubmitted")).values()
    assert ratio.name == "ratio_in_job_warm" and ratio.runs == [10.0, 5.0, 12.0] and ratio.median == 10.0
    assert ratio.median != series["resubmitted"].median / series["in_job_warm"].median, "not a ratio of medians"
    table = "\n".join(recovery._render_restart({"crash": {k: v.to_json() for k, v in {**series, ratio.name: ratio}.items()}}))
    assert "| crash | resubmitted / in-job (warm standby ready), x | 10.00 (5.00-12.00, n=3) |" in table


def results_with(detect: list[float], warm: list[float], date: str) -> dict:
    from bench.spread import Series

    runs = [row("preempt", detect_s=d, restart_s=8.0, lost_s=d + 8.0) for d in detect]
    return {"command": "c", "date": date, "price": 1.0, "machine": "m", "load_before": "1", "load_after": "2",
            "rows": recovery.summarize(runs), "checks": [], "model": {}, "repeats": len(detect), "commit": "abc",
            "restart": {"crash": {"in_job_warm": Series("in_job_warm", warm).to_json()}}}


def test_a_rerun_is_checked_against_the_published_spread():
    published = results_with([2.0, 3.0, 4.0, 5.0, 6.0], [3.0, 3.2, 3.4, 3.6, 3.8], "first")
    rerun = results_with([5.5, 6.0, 6.5, 7.0, 7.5], [3.1, 3.3, 3.5, 3.7, 3.9], "second")
    figures = {r["figure"]: r["inside"] for r in recovery.compare(published, rerun)}
    assert figures["preempt: detect s"] is False and figures["preempt: lost s"] is False, "6.5 is outside 2.0-6.0"
    assert figures["preempt: end -> next first step s"] is True and figures["restart, crash: in-job, warm standby ready"] is True
    section = recovery.render(recovery.rerun_of(published, rerun))
    assert "| 4.0 (2.0-6.0, n=5) |" in section, "the published figures stay the table's"
    # outside the spread, but the two runs overlap (a tie at 6.0): not a move chance cannot give
    assert "| preempt: detect s | 4.00 (2.00-6.00, n=5) | 6.50 (5.50-7.50, n=5) | **no** | 0.024 |" in section
    assert "2 of 4 hold; with nothing changed, 0.7 would fall outside by chance alone" in section
    assert "Moved beyond chance (exact rank test, p < 0.01): 0." in section


def test_a_figure_that_moved_is_named_and_fails_the_rerun():
    published = results_with([2.0, 2.1, 2.2, 2.3, 2.4], [3.0, 3.2, 3.4, 3.6, 3.8], "first")
    rerun = results_with([5.0, 5.1, 5.2, 5.3, 5.4], [3.1, 3.3, 3.5, 3.7, 3.9], "second")
    rows = {r["figure"]: r for r in recovery.compare(published, rerun)}
    assert rows["preempt: detect s"]["moved"] and rows["preempt: detect s"]["shift_p"] == round(2 / 252, 4)
    assert not rows["restart, crash: in-job, warm standby ready"]["moved"]
    section = recovery.render(recovery.rerun_of(published, rerun))
    assert "Moved beyond chance (exact rank test, p < 0.01): 2: preempt: detect s, preempt: lost s." in section
    assert "| preempt: detect s | 2.20 (2.00-2.40, n=5) | 5.20 (5.00-5.40, n=5) | **no** | **0.008** |" in section


def test_rerun_of_a_file_that_is_not_a_published_run_is_one_error(tmp_path, capsys):
    import pytest

    bad = tmp_path / "recovery.json"
    bad.write_text("[1, 2]")
    with pytest.raises(SystemExit) as exit_:
        recovery.main(["--rerun-of", str(bad)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"--rerun-of {bad}" in err and "Traceback" not in err
