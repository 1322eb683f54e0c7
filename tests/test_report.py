"""`jobs report`: the page's plots show what the run recorded, checked against the records
themselves (read here independently of amlhpc.jobs.report.records).

tests/fixtures/runs/cosmoflow-recorded is a real rehearsal (`jobs run cosmoflow --local`,
2 simulated nodes, then the same name again with one epoch more: it resumed from step 8),
kept as written except that the project's path is shortened; its node code and scratch
are left out. Its nodes have no GPU: the utilisation and memory plots show each node's host.
tests/fixtures/runs/llm-h200-recorded is llm-pretrain on one NVIDIA H200 through the launcher
(bench/gpu_node.sh): its GPU plots come from NVML samples (tests/fixtures/runs/README.md).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from amlhpc.jobs import report
from amlhpc.jobs.report import figures, page, records

RECORDED = Path(__file__).parent / "fixtures" / "runs" / "cosmoflow-recorded"
ON_H200 = RECORDED.parent / "llm-h200-recorded"


def telemetry(folder: Path) -> list[dict]:
    return [json.loads(line) for path in sorted(folder.rglob("telemetry*.jsonl"))
            for line in path.read_text().splitlines()]


def metric_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if re.match(r'^\{"step": \d+', line)]


def attempt_lines() -> list[dict]:
    return [json.loads(line) for line in (RECORDED / "attempts.jsonl").read_text().splitlines()]


def path_points(svg: str, gid: str) -> int:
    """Vertices of the path a series was drawn as (`<g id="gid"><path d="M ... L ...">`)."""
    group = svg[svg.index(f'<g id="{gid}">'):]
    d = re.search(r'<path d="([^"]+)"', group).group(1)
    return d.count("M") + d.count("L")


def texts(svg: str) -> list[str]:
    return re.findall(r"<text[^>]*>([^<]*)</text>", svg)


@pytest.fixture(scope="module")
def run() -> records.RunRecords:
    return records.read(RECORDED)


@pytest.fixture(scope="module")
def plots(run) -> dict[str, figures.Plot]:
    return {p.key: p for p in figures.all_plots(run)}


class TestRecordedRun:
    def test_loss_has_every_step_rank_0_logged_each_attempt_its_own_line(self, run, plots):
        logged = [(line["step"], line["loss"]) for line in metric_lines(RECORDED / "node0/user_logs/std_log_process_0.txt")
                  if "loss" in line]
        assert len(logged) == 12 and logged[0][0] == 1 and logged[-1][0] == 12  # 8 steps, then 4 more after resuming
        plot = plots["loss"]
        # two attempts (the launcher's `starting:` line begins each): two lines, none across the gap
        assert plot.series["loss-0-0"] == [(float(s), v) for s, v in logged[:8]]
        assert plot.series["loss-0-1"] == [(float(s), v) for s, v in logged[8:]]
        assert path_points(plot.svg, "loss-0-0") == 8 and path_points(plot.svg, "loss-0-1") == 4
        assert run.loss.attempts == [1, 2]
        epochs = [(line["step"], line["epoch_loss"]) for line in
                  metric_lines(RECORDED / "node0/user_logs/std_log_process_0.txt") if "epoch_loss" in line]
        assert plot.series["loss-m0-0"] + plot.series["loss-m0-1"] == [(float(s), v) for s, v in epochs]
        assert len(epochs) == 3
        labels = texts(plot.svg)
        assert "step" in labels and "loss" in labels and "12" in labels and "mean loss per epoch" in labels
        assert " attempt 2" in labels, "where the second attempt starts is marked"
        assert "a circle for the mean of each epoch" in plot.note and "2 attempts, each its own line" in plot.note
        top = max(v for _, v in logged)
        assert any(t.replace("\u2212", "-") == f"{top:.1f}" for t in labels) or float(labels[labels.index("loss") - 1]) <= top + 0.1

    def test_throughput_is_samples_per_second_at_each_epoch_end(self, plots):
        logged = [(float(line["step"]), line["samples_per_s"]) for line in
                  metric_lines(RECORDED / "node0/user_logs/std_log_process_0.txt") if "samples_per_s" in line]
        plot = plots["throughput"]
        assert plot.series["throughput-0-0"] + plot.series["throughput-0-1"] == logged
        assert path_points(plot.svg, "throughput-0-0") == 2 and path_points(plot.svg, "throughput-0-1") == 1
        assert "samples/s" in texts(plot.svg)

    def test_step_axes_have_whole_steps_only(self, plots):
        for key in ("loss", "throughput", "mfu", "step-time"):
            svg = plots[key].svg
            ticks = re.findall(r'<g id="[\w-]*xtick_\d+">.*?<text[^>]*>([^<]*)</text>', svg, re.S)
            assert ticks and all(t.replace("\u2212", "-").lstrip("-").isdigit() for t in ticks), (key, ticks)

    def test_timeline_lays_each_nodes_phases_end_to_end(self, run, plots):
        plot = plots["timeline"]
        for node in (0, 1):
            launch = json.loads((RECORDED / f"node{node}/outputs/aml-hpc/launch-node00{node}.json").read_text())
            start = 0.0
            for phase in [p for p in records.LAUNCH_PHASES if p in launch["phases"]]:  # node 1 uploads nothing
                seconds = launch["phases"][phase]
                assert plot.series[f"timeline-n{node}-{phase}"] == [(pytest.approx(start), pytest.approx(start + seconds))]
                assert f'id="timeline-n{node}-{phase}"' in plot.svg
                start += seconds
        assert "node 0" in texts(plot.svg) and "node 1" in texts(plot.svg) and "seconds from launch" in texts(plot.svg)
        staged = {(s.node, s.input): s for s in run.staging}
        doc = json.loads((RECORDED / "node1/outputs/aml-hpc/staging-node1.json").read_text())["inputs"][0]
        assert staged[(1, "cosmoflow")].bytes_out == doc["bytes_out"] and staged[(1, "cosmoflow")].files == doc["files_node"]

    def test_attempts_and_their_cost_at_the_planned_price(self, plots):
        lines = attempt_lines()
        assert len(lines) == 2
        plot = plots["attempts"]
        assert {k for k in plot.series if k.startswith("attempts-bar-")} == {"attempts-bar-1", "attempts-bar-2"}
        costs = []
        for line in lines:
            hours = (datetime.fromisoformat(line["ended_at"].replace("Z", "+00:00"))
                     - datetime.fromisoformat(line["started_at"].replace("Z", "+00:00"))).total_seconds() / 3600
            costs.append(line["nodes"] * hours * line["usd_per_node_hour"])
        cumulative = plot.series["attempts-cost"]
        bars = [plot.series["attempts-bar-1"][0], plot.series["attempts-bar-2"][0]]
        # the total rises through each attempt and stays flat between them: no jump at an attempt's end
        assert cumulative == [(bars[0][0], 0.0), (bars[0][1], pytest.approx(costs[0])),
                              (bars[1][0], pytest.approx(costs[0])), (bars[1][1], pytest.approx(sum(costs)))]
        assert "Standard_ND96asr_v4" in plot.note and "$27.197/node-hour" in plot.note
        labels = texts(plot.svg)
        assert "cumulative $" in labels and "minutes since the first attempt started" in labels
        assert "1: succeeded" in labels and "2: succeeded" in labels, "each bar says which attempt and how it ended"

    def test_mfu_is_rank_0s_fraction_as_a_percentage(self, plots):
        logged = [(float(line["step"]), line["mfu"] * 100) for line in
                  metric_lines(RECORDED / "node0/user_logs/std_log_process_0.txt") if "mfu" in line]
        assert len(logged) == 12 and all(0 < v < 100 for _, v in logged)
        assert plots["mfu"].series["mfu-0-0"] + plots["mfu"].series["mfu-0-1"] == [(s, pytest.approx(v)) for s, v in logged]
        assert "MFU %" in texts(plots["mfu"].svg)

    def test_a_run_whose_attempts_measured_two_peaks_says_mfu_jumps(self, run, plots):
        """Recorded before the peak was kept across attempts: each attempt timed its own GEMM."""
        headers = [json.loads(line) for line in (RECORDED / "node0/user_logs/std_log_process_0.txt").read_text().splitlines()
                   if line.startswith('{"flops_per_sample"')]
        assert [(p.attempt, p.tflops) for p in run.peaks] == [(1, headers[0]["peak_tflops"]), (2, headers[1]["peak_tflops"])]
        assert "Warning: the peak was measured again by a later attempt" in plots["mfu"].note

    def test_step_time_has_a_line_per_node_from_that_nodes_own_log(self, plots):
        for node, rank in ((0, 0), (1, 1)):
            logged = [(float(line["step"]), line["step_time_s"]) for line in
                      metric_lines(RECORDED / f"node{node}/user_logs/std_log_process_{rank}.txt") if "step_time_s" in line]
            assert len(logged) == 12, node
            assert [p for segment in (v for k, v in sorted(plots["step-time"].series.items())
                                      if k.startswith(f"step-time-{node}-")) for p in segment] == logged
        assert {"node 0", "node 1"} <= set(texts(plots["step-time"].svg))

    def test_a_node_without_gpus_shows_its_hosts_utilisation_and_memory(self, plots):
        samples = [s for s in telemetry(RECORDED) if s["node"] == 1]
        start = min(s["time"] for s in telemetry(RECORDED))
        busy = [(s["time"] - start, s["host"]["cpu_busy_pct"]) for s in samples if "cpu_busy_pct" in s["host"]]
        used = [(s["time"] - start, s["host"]["memory_used_gib"]) for s in samples]
        assert len(busy) > 10 and all("absent" in s["gpus"] for s in samples)
        util, memory = plots["gpu-util"], plots["gpu-memory"]
        assert util.title == "Host CPU utilisation" and memory.title == "Host memory"
        def whole(plot, prefix):
            return [p for key, segment in sorted(plot.series.items(), key=lambda kv: int(kv[0].rsplit("-", 1)[1]))
                    if key.startswith(prefix) for p in segment]

        assert whole(util, "gpu-util-1-") == [(pytest.approx(t), pytest.approx(v)) for t, v in busy]
        assert whole(memory, "gpu-memory-1-") == [(pytest.approx(t), pytest.approx(v)) for t, v in used]
        # no line across the 18 s between the attempts: a segment per attempt, each shaded and labelled
        assert len([k for k in util.series if k.startswith("gpu-util-1-")]) == 2
        assert " attempt 1" in texts(util.svg) and " attempt 2" in texts(util.svg)
        assert "No GPU was sampled" in util.note and samples[0]["gpus"]["absent"] in util.note
        assert "CPU busy %" in texts(util.svg)

    def test_the_page_is_self_contained(self, tmp_path):
        path = report.write(RECORDED, tmp_path / "r.html", now=datetime(2026, 11, 25, tzinfo=UTC))
        html = path.read_text()
        assert html.count("<svg") == 8 and html.count('class="missing"') == 0
        assert "8 of 8 plots recorded" in html
        assert "<script" not in html and "<link" not in html and not re.search(r'(src|href)="https?:', html)
        ids = re.findall(r'\bid="([^"]+)"', html)
        assert len(ids) == len(set(ids)), "ids shared between plots"
        again = report.write(RECORDED, tmp_path / "again.html", now=datetime(2026, 11, 25, tzinfo=UTC)).read_text()
        assert again == html, "the same records give the same page"


class TestManagedRun:
    """tests/fixtures/runs/cosmoflow-managed: `jobs run cosmoflow --local --managed --fault
    preempt@step=3,node=1`, recorded: node 1 preempted in the first attempt (at step 3, before any
    checkpoint), the second attempt trained from the start to step 8."""

    MANAGED = RECORDED.parent / "cosmoflow-managed"

    def test_attempts_and_costs_come_from_the_record(self):
        record = json.loads((self.MANAGED / "supervision.json").read_text())
        r = records.read(self.MANAGED)
        plot = figures.attempts(r)
        assert [a.outcome for a in r.attempts] == ["Failed: preempted", "Completed: completed"]
        assert plot.series["attempts-cost"][-1][1] == pytest.approx(sum(a["usd"] for a in record["attempts"]))
        first = record["attempts"][0]
        hours = (datetime.fromisoformat(first["ended_at"]) - datetime.fromisoformat(first["started_at"])).total_seconds() / 3600
        assert plot.series["attempts-bar-1"] == [(0.0, pytest.approx(hours * 60))]  # minutes: a short run
        assert "the managed run's record" in plot.note and r.outcome.startswith("succeeded")

    def test_the_second_attempt_is_a_second_segment_of_the_loss(self):
        plot = figures.loss(records.read(self.MANAGED))
        steps = [m["step"] for m in metric_lines(self.MANAGED / "node0/user_logs/std_log_process_0.txt") if "loss" in m]
        back = next(i for i in range(1, len(steps)) if steps[i] <= steps[i - 1])  # the second attempt starts over
        assert [len(v) for k, v in sorted(plot.series.items()) if k.startswith("loss-0-")] == [back, len(steps) - back]
        assert "go back 1 time(s)" in plot.note


@pytest.fixture(scope="module")
def gpu_plots() -> dict[str, figures.Plot]:
    return {p.key: p for p in figures.all_plots(records.read(ON_H200))}


class TestGpuRun:
    """llm-pretrain on one H200: every figure from the GPU's own records."""

    def test_gpu_utilisation_and_memory_are_the_nvml_samples(self, gpu_plots):
        samples = telemetry(ON_H200)
        start = samples[0]["time"]
        util = [(s["time"] - start, s["gpus"][0]["util_percent"]) for s in samples]
        memory = [(s["time"] - start, s["gpus"][0]["memory_used_mib"] / 1024) for s in samples]
        assert gpu_plots["gpu-util"].title == "GPU utilisation" and gpu_plots["gpu-memory"].title == "GPU memory"
        assert gpu_plots["gpu-util"].series["gpu-util-0-0"] == [(pytest.approx(t), v) for t, v in util]
        assert gpu_plots["gpu-memory"].series["gpu-memory-0-0"] == [(pytest.approx(t), pytest.approx(v)) for t, v in memory]
        assert max(v for _, v in util) >= 90 and max(v for _, v in memory) > 30  # a busy GPU, 38 GiB in use
        assert "utilisation %" in texts(gpu_plots["gpu-util"].svg) and "GiB used" in texts(gpu_plots["gpu-memory"].svg)

    def test_mfu_against_the_catalogs_peak(self, gpu_plots):
        lines = (ON_H200 / "node0/user_logs/std_log_process_0.txt").read_text().splitlines()
        header = json.loads(next(line for line in lines if line.startswith('{"model"')))
        assert header["device"] == "cuda" and header["peak_tflops"] == 989.0 and "H200" in header["peak_source"]
        logged = [(float(m["step"]), m["mfu"] * 100) for m in map(json.loads, (x for x in lines if x.startswith('{"step"')))]
        assert gpu_plots["mfu"].series["mfu-0-0"] == [(s, pytest.approx(v)) for s, v in logged]
        steady = [v for s, v in logged if s > 5]
        assert 25 < min(steady) and max(steady) < 35  # per cent of the dense bf16 peak
        # one launcher run outside a rehearsal: no attempts record, every other plot drawn
        assert [k for k, p in gpu_plots.items() if p.svg is None] == ["attempts"]

    def test_captions_say_what_this_run_drew(self, gpu_plots):
        """llm-pretrain logs no epoch loss: its caption mentions no circles (it used to)."""
        assert "circle" not in gpu_plots["loss"].note and "a line per step" in gpu_plots["loss"].note
        assert "one peak for the whole run" in gpu_plots["mfu"].note and "H200" in gpu_plots["mfu"].note


class TestOtherRecords:
    def test_telemetry_mfu_and_step_times_in_the_documented_format(self, tmp_path):
        node0 = tmp_path / "node0" / "user_logs"
        node0.mkdir(parents=True)
        node0.joinpath("std_log_process_0.txt").write_text("\n".join(
            json.dumps({"step": s, "loss": 2.0 / s, "tokens_per_s": 1000.0 + s, "mfu": 0.40 + s / 100,
                        "step_time_s": 0.5, "node": 0}) for s in range(1, 6)) + "\nnot json\n")
        node1 = tmp_path / "node1" / "user_logs"
        node1.mkdir(parents=True)
        node1.joinpath("std_log_process_1.txt").write_text("\n".join(
            json.dumps({"step": s, "step_time_s": 0.5 + s / 10, "node": 1}) for s in range(1, 6)))
        samples = [{"time": 1000 + 5 * i, "node": 0, "gpus": [{"index": 0, "util_percent": 90 + i, "memory_used_mib": 40960},
                                                              {"index": 1, "util_percent": 10, "memory_used_mib": 1024}]}
                   for i in range(4)]
        (tmp_path / "node0" / "telemetry-node0.jsonl").write_text("\n".join(json.dumps(s) for s in samples))
        r = records.read(tmp_path)
        plots = {p.key: p for p in figures.all_plots(r)}
        assert plots["mfu"].series["mfu-0-0"] == [(float(s), pytest.approx(40 + s)) for s in range(1, 6)]
        assert plots["throughput"].series["throughput-0-0"][0] == (1.0, 1001.0) and "tokens/s" in texts(plots["throughput"].svg)
        assert plots["step-time"].series["step-time-1-0"] == [(float(s), pytest.approx(0.5 + s / 10)) for s in range(1, 6)]
        assert plots["gpu-util"].series["gpu-util-0-0"] == [(0.0, 90.0), (5.0, 91.0), (10.0, 92.0), (15.0, 93.0)]
        assert plots["gpu-memory"].series["gpu-memory-0-0"][0] == (0.0, 40.0)  # GiB
        assert "node 0 gpu 1" in texts(plots["gpu-util"].svg)

    def test_telemetry_of_a_node_without_gpus_has_no_gpu_figures(self, tmp_path):
        """A CPU node's samples say why there are no GPU figures (amlhpc/jobs/runtime/node/telemetry.py)."""
        sample = {"time": 1000, "node": 0, "gpus": {"absent": "NVML did not initialise"}, "host": {"cpu_busy_pct": 50.0}}
        (tmp_path / "node0").mkdir()
        (tmp_path / "node0" / "telemetry-node000.jsonl").write_text(json.dumps(sample) + "\n")
        r = records.read(tmp_path)
        assert r.gpu_util == {} and r.gpu_memory == {} and not r.problems

    def test_a_restart_starts_a_new_segment(self, tmp_path):
        log = tmp_path / "node0" / "user_logs" / "std_log_process_0.txt"
        log.parent.mkdir(parents=True)
        steps = [1, 2, 3, 4, 3, 4, 5]  # preempted after 4, resumed from the checkpoint of step 2
        log.write_text("\n".join(json.dumps({"step": s, "loss": 1.0 / s}) for s in steps))
        plot = figures.loss(records.read(tmp_path))
        assert [len(v) for k, v in sorted(plot.series.items())] == [4, 3]
        assert "go back 1 time(s)" in plot.note

    def test_an_unreadable_record_is_named_not_guessed(self, tmp_path):
        (tmp_path / "node0" / "outputs" / "aml-hpc").mkdir(parents=True)
        (tmp_path / "node0" / "outputs" / "aml-hpc" / "launch-node000.json").write_text("{broken")
        r = records.read(tmp_path)
        assert r.phases == [] and any("launch-node000.json" in p for p in r.problems)
        assert "could not be read" in page.render(r, figures.all_plots(r))


class TestCommands:
    @pytest.fixture()
    def project(self, tmp_path, monkeypatch):
        from amlhpc.jobs.local import folders

        shutil.copytree(RECORDED, tmp_path / ".rehearsal" / "cosmoflow-recorded")
        monkeypatch.setattr(folders, "REHEARSALS", tmp_path / ".rehearsal")
        return tmp_path

    def run(self, *args):
        from typer.testing import CliRunner

        from amlhpc.jobs.cli.main import app

        return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})

    def test_report_list_show_logs_of_a_rehearsal(self, project):
        result = self.run("report", "cosmoflow-recorded", "--local")
        assert result.exit_code == 0, result.output
        assert (project / ".rehearsal" / "cosmoflow-recorded" / "report.html").is_file()
        listed = json.loads(self.run("list", "--local", "--json").stdout)
        assert listed[0]["run"] == "cosmoflow-recorded" and listed[0]["attempts"] == 2 and listed[0]["state"] == "succeeded"
        shown = json.loads(self.run("show", "cosmoflow-recorded", "--local", "--json").stdout)
        assert shown["summary"]["steps"] == 12 and shown["report"].endswith("report.html")
        node1 = self.run("logs", "cosmoflow-recorded", "--local", "--node", "1")
        assert node1.exit_code == 0 and node1.stdout == (RECORDED / "node1/user_logs/std_log_process_1.txt").read_text()

    def test_unknown_run_and_node_are_bad_input(self, project):
        unknown = self.run("logs", "cosmoflow-recorde", "--local")
        assert unknown.exit_code == 2 and "did you mean cosmoflow-recorded?" in unknown.stderr
        node = self.run("logs", "cosmoflow-recorded", "--local", "--node", "5")
        assert node.exit_code == 2 and "no such simulated node" in node.stderr

    def test_azure_commands_need_a_stack_and_refuse_offline(self, project):
        missing = self.run("list")
        assert missing.exit_code == 2 and "add --stack S" in missing.stderr
        offline = self.run("logs", "some-job", "--stack", "dev", "--offline")
        assert offline.exit_code == 2 and "--offline" in offline.stderr and "needs Azure" in offline.stderr


@pytest.mark.slow
def test_the_page_renders_in_headless_chromium(tmp_path):
    """Every plot drawn and the page laid out by a real browser engine (where one is installed)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        pytest.skip("no Chromium on this machine (apt-get install chromium); the page is checked as HTML above")
    path = report.write(RECORDED, tmp_path / "report.html")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([browser, *flags, "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count("<svg") == 8 and "Loss" in dom.stdout
    shot = tmp_path / "page.png"
    subprocess.run([browser, *flags, f"--screenshot={shot}", "--window-size=1280,3000", path.as_uri()],
                   capture_output=True, text=True, timeout=120)
    from PIL import Image

    image = Image.open(shot).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 20) or []
    blue = sum(n for n, (r, g, b) in colours if b > 200 and r < 80 and 90 < g < 140)  # the plots' #1f6feb lines
    assert image.size == (1280, 3000) and blue > 200, f"no plotted line visible ({blue} blue pixels)"


def test_without_matplotlib_the_report_names_the_extra(tmp_path, monkeypatch):
    """matplotlib is the `report` extra: missing, `jobs report` says how to add it, and reads nothing."""
    import importlib.util

    from amlhpc.core.errors import UserError
    from amlhpc.jobs import report as run_report

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    with pytest.raises(UserError) as raised:
        run_report.write(tmp_path / "no-such-run")
    text = str(raised.value.problems[0])
    assert "matplotlib" in text and not (tmp_path / "no-such-run").exists()
    from amlhpc.core import invocation

    assert ("make bootstrap" if invocation.from_clone() else "aml-hpc[report]") in text


def attempts_kept(tmp_path: Path) -> Path:
    """The recorded run as a rehearsal now keeps it: each attempt's launcher and staging
    reports under attempts/<n>/node<K>/ (here attempt 1's made from attempt 2's, slower)."""
    folder = tmp_path / "cosmoflow-recorded"
    shutil.copytree(RECORDED, folder)
    for number, factor in ((1, 2.0), (2, 1.0)):
        for node in (0, 1):
            kept = folder / "attempts" / str(number) / f"node{node}"
            kept.mkdir(parents=True)
            launch = json.loads((RECORDED / f"node{node}/outputs/aml-hpc/launch-node00{node}.json").read_text())
            launch["phases"] = {k: v * factor for k, v in launch["phases"].items()}
            (kept / f"launch-node00{node}.json").write_text(json.dumps(launch))
            staging = json.loads((RECORDED / f"node{node}/outputs/aml-hpc/staging-node{node}.json").read_text())
            for item in staging["inputs"]:
                item["seconds"] = item["seconds"] * factor
            (kept / f"staging-node{node}.json").write_text(json.dumps(staging))
    return folder


class TestEveryAttempt:
    def test_staging_and_the_timeline_show_every_attempt(self, tmp_path):
        r = records.read(attempts_kept(tmp_path))
        assert [(p.attempt, p.node) for p in r.phases] == [(1, 0), (1, 1), (2, 0), (2, 1)]
        assert [(s.attempt, s.node) for s in r.staging] == [(1, 0), (1, 1), (2, 0), (2, 1)]
        first, second = r.phases[0], r.phases[2]
        assert first.phases["training"] == pytest.approx(2 * second.phases["training"])
        plot = figures.timeline(r)
        assert "timeline-a1-n0-training" in plot.series and "timeline-a2-n1-staging" in plot.series
        assert "attempt 1 · node 0" in texts(plot.svg) and "attempt 2 · node 1" in texts(plot.svg)
        html = page.render(r, figures.all_plots(r))
        assert "staged data per node and attempt" in html and "launcher phases, seconds, per attempt" in html


CHAR_PX, CELL_PADDING_PX = 7.2, 16
"""A record table's text (12.5 px system-ui) is about 7 px a character; each cell adds 8 px a side."""


def _min_table_width(table_html: str) -> float:
    """The narrowest a table can be: each column as wide as its longest word (cells wrap at spaces)."""
    rows = re.findall(r"<tr>(.*?)</tr>", table_html, re.S)
    cells = [re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row, re.S) for row in rows]
    columns = max(len(row) for row in cells)
    widest = [max((len(word) for row in cells if i < len(row) for word in re.sub("<[^>]+>", "", row[i]).split()),
                  default=1) for i in range(columns)]
    return sum(w * CHAR_PX + CELL_PADDING_PX for w in widest)


def _card_width(viewport: int) -> float:
    """A records card's content width: main (1120 px at most, 32 px padding a side; 12 px below 600 px),
    less the card's 16 px padding and 1 px border a side."""
    padding = 12 if viewport <= 600 else 32
    return min(1120, viewport) - 2 * padding - 2 * 16 - 2


def test_every_record_table_fits_its_card_at_common_widths(tmp_path):
    """No Chromium here to lay the page out: each record table's narrowest width (its longest
    words) against its card's width at desktop widths (1,400 px among them); narrower (a
    tablet, a phone) a table scrolls inside its card instead of leaving it."""
    r = records.read(attempts_kept(tmp_path))
    html = page.render(r, figures.all_plots(r))
    records_part = html[html.index("<h2>Records</h2>"):]
    tables = re.findall(r'<div class="scroll"><table>.*?</table></div>', records_part, re.S)
    assert len(tables) == 4 and records_part.count("<table>") == 4, "every table scrolls inside its card"
    assert ".scroll{overflow-x:auto" in html and ".records{display:grid;grid-template-columns:minmax(0,1fr)" in html
    for viewport in (1920, 1400, 1280, 1024):
        for table_html in tables:
            assert _min_table_width(table_html) <= _card_width(viewport), (viewport, table_html[:200])
    assert "section svg{width:100%" in html and "minmax(min(480px,100%),1fr)" in html
