"""The GPU round's benchmarks refuse bad arguments with a message naming the option and the fix,
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
