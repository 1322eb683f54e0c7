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
    target.write_text("# Staging benchmark\n\nkept\n\n# Recovery benchmark\n\nold table\n")
    monkeypatch.setattr(recovery, "RESULTS", target)
    text = recovery.write(results, tmp_path / "out", update=True)
    written = target.read_text()
    assert written.startswith("# Staging benchmark\n\nkept\n\n# Recovery benchmark") and "old table" not in written
    assert "| preempt | succeeded | 2 (preempted, completed) | 1.5 | 7.0 | 0 |" in text
    assert "- never two attempts at once: **met**" in text
