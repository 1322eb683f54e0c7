"""GPU application clocks at maximum for the job and reset afterwards (the NDv4 performance article), on a fake NVML."""

from __future__ import annotations

import json

import pytest

from amlhpc.jobs.runtime.node import clocks
from amlhpc.jobs.runtime.node.nvml import NvmlSession, open_nvml
from tests import fake_nvml
from tests.fake_nvml import FakeGpu, FakeNvml, nd96asr_gpus


class TestFakeMatchesRealBindings:
    def test_names_and_values_exist_in_pynvml(self):
        """The fake is only a fair seam if the real bindings have the same names and codes."""
        pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is a declared dependency of the runtime")
        for name in fake_nvml.CONSTANTS:
            assert getattr(pynvml, name) == getattr(fake_nvml, name), name
        for name in fake_nvml.FAKE_FUNCTIONS:
            assert callable(getattr(pynvml, name)), name

    def test_real_bindings_without_a_driver_say_why(self):
        """On this machine (no NVIDIA driver) the real pynvml fails to initialise: a reason, no crash."""
        pytest.importorskip("pynvml")
        session = open_nvml()
        assert session.lib is None
        assert "NVML did not initialise" in session.reason


class TestSetMax:
    def test_ndv4_article_pair_on_every_gpu(self):
        """A100: memory 1215 MHz, SM 1410 MHz, the pair the NDv4 performance article sets with nvidia-smi -ac."""
        lib = FakeNvml(nd96asr_gpus(8))
        results = clocks.set_max_clocks(lib)
        assert [(r.status, r.memory_mhz, r.graphics_mhz) for r in results] == [("set", 1215, 1410)] * 8
        assert results[0].bus_id == "00000001:00:00.0"
        assert all(g.app_clocks == {lib.NVML_CLOCK_MEM: 1215, lib.NVML_CLOCK_GRAPHICS: 1410} for g in lib.gpus)

    def test_graphics_max_is_the_one_valid_at_max_memory(self):
        """The highest graphics clock overall may not be valid with the highest memory clock."""
        gpu = FakeGpu("00000001:00:00.0", memory_clocks=(1593, 1000),
                      graphics_clocks={1593: (1380, 1200), 1000: (1530,)})
        (result,) = clocks.set_max_clocks(FakeNvml([gpu]))
        assert (result.status, result.memory_mhz, result.graphics_mhz) == ("set", 1593, 1380)

    def test_no_permission_is_a_skip_with_the_fix(self):
        lib = FakeNvml([FakeGpu("00000001:00:00.0", clocks_error=fake_nvml.NVML_ERROR_NO_PERMISSION)])
        (result,) = clocks.set_max_clocks(lib)
        assert result.status == "skipped"
        assert "nvidia-smi -acp UNRESTRICTED" in result.reason

    def test_not_supported_is_a_skip_naming_the_gpu(self):
        lib = FakeNvml([FakeGpu("00000001:00:00.0", name="NVIDIA H100 80GB HBM3", clocks_error=fake_nvml.NVML_ERROR_NOT_SUPPORTED)])
        (result,) = clocks.set_max_clocks(lib)
        assert result.status == "skipped" and "H100" in result.reason


class TestContext:
    def test_reset_after_the_block(self):
        """Inside: maximum clocks; after: the defaults again, on every GPU that was changed."""
        lib = FakeNvml(nd96asr_gpus(2))
        session = NvmlSession(lib)
        with clocks.max_application_clocks(session) as changes:
            assert all(c.status == "set" for c in changes)
            assert lib.gpus[1].app_clocks[lib.NVML_CLOCK_GRAPHICS] == 1410
        assert [g.app_clocks[lib.NVML_CLOCK_GRAPHICS] for g in lib.gpus] == [1095, 1095]
        assert [c[0] for c in lib.calls] == ["set", "set", "reset", "reset"]

    def test_reset_even_when_the_block_fails(self):
        lib = FakeNvml(nd96asr_gpus(1))
        with pytest.raises(RuntimeError), clocks.max_application_clocks(NvmlSession(lib)):
            raise RuntimeError("training crashed")
        assert lib.gpus[0].app_clocks[lib.NVML_CLOCK_GRAPHICS] == 1095

    def test_skipped_gpus_are_not_reset(self):
        gpus = nd96asr_gpus(2)
        gpus[1].clocks_error = fake_nvml.NVML_ERROR_NO_PERMISSION
        lib = FakeNvml(gpus)
        with clocks.max_application_clocks(NvmlSession(lib)):
            pass
        assert ("reset", gpus[1].bus_id) not in lib.calls
        assert ("reset", gpus[0].bus_id) in lib.calls

    def test_without_nvml_nothing_happens(self):
        with clocks.max_application_clocks(NvmlSession(None, "no driver")) as changes:
            assert changes == []


class TestCli:
    def test_show_without_driver_exits_1_with_reason(self, capsys):
        assert clocks.main(["show"]) == 1
        assert "clocks:" in capsys.readouterr().err

    def test_max_then_reset_on_a_fake(self, monkeypatch, capsys):
        lib = FakeNvml(nd96asr_gpus(2))
        monkeypatch.setattr(clocks, "open_nvml", lambda: NvmlSession(lib))
        assert clocks.main(["max"]) == 0
        assert [r["status"] for r in json.loads(capsys.readouterr().out)] == ["set", "set"]
        assert clocks.main(["reset"]) == 0
        assert [r["status"] for r in json.loads(capsys.readouterr().out)] == ["reset", "reset"]
        assert clocks.main(["show"]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert shown[0]["applicationGraphicsMhz"] == 1095 and shown[0]["maxGraphicsMhz"] == 1410
