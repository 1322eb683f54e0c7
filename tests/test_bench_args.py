"""The benchmarks refuse bad arguments with a message naming the option and the fix,
before any state is made or any folder written."""

from __future__ import annotations

import pytest


def test_checkpoint_on_cuda_without_a_gpu_is_refused_by_name(monkeypatch, capsys, tmp_path):
    torch = pytest.importorskip("torch")
    from bench import checkpoint

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_:
        checkpoint.main(["--device", "cuda", "--skip", "restore,recovery", "--out", str(tmp_path / "out")])
    assert exit_.value.code == 2
    assert "--device cuda: torch sees no CUDA GPU here" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_checkpoint_refuses_an_unknown_device(capsys):
    from bench import checkpoint

    with pytest.raises(SystemExit) as exit_:
        checkpoint.main(["--device", "tpu"])
    assert exit_.value.code == 2 and "--device: invalid choice: 'tpu'" in capsys.readouterr().err


@pytest.mark.parametrize("option", ["--mib", "--writers", "--repeats"])
def test_writer_beside_refuses_less_than_one(option, capsys):
    from bench import writer_beside

    with pytest.raises(SystemExit) as exit_:
        writer_beside.main([option, "0"])
    assert exit_.value.code == 2 and f"{option} 0: give a whole number of at least 1" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "said"), [
    (["--shrink-to", "1001"], "--shrink-to 1001 must be from 1 to --nodes (1000)"),
    (["--shrink-to", "-1"], "--shrink-to -1 must be from 1 to --nodes (1000)"),
    (["--nodes", "0"], "--nodes must be at least 1"),
    (["--seeds", "0"], "--seeds must be at least 1")])
def test_scale_data_refuses_a_shrink_it_cannot_model(argv, said, capsys):
    from bench import scale_data

    with pytest.raises(SystemExit) as exit_:
        scale_data.main(argv)
    assert exit_.value.code == 2 and said in capsys.readouterr().err


def test_scale_data_says_what_a_shrink_restore_reads(capsys):
    """The data part's shrink line, on a small job (one seed): the model's figure, its bound."""
    from bench import scale_data

    assert scale_data.main(["--nodes", "20", "--shrink-to", "18", "--seeds", "1", "--accounts", "1"]) == 0
    line = next(row for row in capsys.readouterr().out.splitlines() if row.startswith("Shrink restore"))
    figure = float(line.split(": ", 1)[1].split("x", 1)[0])
    assert line.startswith("Shrink restore from 20 to 18 nodes") and 1.0 <= figure <= scale_data.SHRINK_BOUND
