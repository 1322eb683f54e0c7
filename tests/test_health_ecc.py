"""GPU memory health under the rules of Azure's azure_gpu_ecc.nhc: the limits read out of the
pinned copy of Azure's script, and the grading on recorded `nvidia-smi -q` output
(tests/fixtures/tool-output/SOURCES.toml) and Azure's own V100 retirement samples."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from amlhpc.core import skus
from amlhpc.jobs.runtime.health import ecc
from amlhpc.jobs.runtime.health.ecc import (
    EccLimits,
    MemoryCounters,
    check_ecc,
    grade_memory,
    parse_smi_memory,
)
from amlhpc.jobs.runtime.health.grading import FAIL, NOT_CHECKED, PASS, WARN
from amlhpc.jobs.runtime.node.nvml import NvmlSession
from tests import fake_nvml
from tests.fake_nvml import FakeNvml, nd96asr_gpus
from tests.test_health_tools import recorded_tools, sample

REFERENCE = Path(__file__).parent / "reference" / "azurehpc-health-checks"
SCRIPT = (REFERENCE / "customTests" / "azure_gpu_ecc.nhc").read_text()
AZURE = EccLimits(dram=20_000_000, sram_correctable=10_000)


class TestAzuresScript:
    def test_remap_and_retirement_limits_are_the_scripts(self):
        assert f"-gt {ecc.REMAP_UNCORRECTABLE_LIMIT}" in SCRIPT
        assert f'"$total" -ge {ecc.RETIREMENT_TABLE_PAGES}' in SCRIPT and '"$pending" == "Yes"' in SCRIPT

    def test_azures_remap_count_rule_reads_a_field_its_query_lacks(self):
        """Recorded so the difference stays deliberate: the query asks for three fields and the
        rule reads the fourth (index 3), so in Azure's run the 512-row rule never fires."""
        query = re.search(r'GPU_REMAPPED_ROWS_QUERY="([^"]+)"', SCRIPT).group(1)
        assert len(query.split(",")) == 3
        assert "gpu_remapped_rows_query_out_line[3]} -gt 512" in SCRIPT

    def test_every_catalog_limit_is_what_the_sizes_conf_passes(self):
        checked = 0
        for sku in map(skus.get, skus.names()):
            conf = REFERENCE / "conf" / f"{sku.name.removeprefix('Standard_').lower()}.conf"
            if not conf.exists():
                continue
            call = re.search(r"check_gpu_ecc ?(\d*) ?(\d*)", conf.read_text())
            if call is None:
                continue
            dram, sram = (int(v) if v else None for v in call.groups())
            assert (sku.health.ecc_dram_limit, sku.health.ecc_sram_correctable_limit) == (dram, sram), sku.name
            checked += 1
        assert checked >= 12


class TestRules:
    """Cases where the gate was looser than Azure before (each passed or only warned)."""

    @pytest.mark.parametrize("counters, why", [
        (MemoryCounters(sram_uncorrected_aggregate=2, sram_uncorrected_volatile=0), "in the GPU's lifetime"),
        (MemoryCounters(sram_corrected_volatile=10_001), "correctable SRAM errors 10001 volatile"),
        (MemoryCounters(sram_corrected_aggregate=10_001), "above 10000"),
        (MemoryCounters(dram_corrected_aggregate=20_000_001), "above 20000000"),
        (MemoryCounters(dram_uncorrected_volatile=20_000_001), "DRAM ECC errors"),
        (MemoryCounters(remap_uncorrectable=513), "513 rows remapped for uncorrectable errors"),
    ])
    def test_fails(self, counters, why):
        status, problems = grade_memory(counters, AZURE)
        assert status == FAIL and why in "; ".join(problems)

    def test_at_the_limits_passes(self):
        counters = MemoryCounters(sram_corrected_volatile=10_000, dram_corrected_aggregate=20_000_000, remap_uncorrectable=512)
        assert grade_memory(counters, AZURE) == (PASS, [])

    def test_without_limits_only_the_absolute_rules_apply(self):
        assert grade_memory(MemoryCounters(sram_corrected_volatile=50_000), EccLimits())[0] == PASS
        assert grade_memory(MemoryCounters(sram_uncorrected_aggregate=1), EccLimits())[0] == FAIL

    def test_nvml_reads_dram_and_correctable_sram(self):
        """NVML's corrected SRAM and DRAM counters reach the rules (before, only uncorrected SRAM was read)."""
        gpus = nd96asr_gpus(2)
        key = (fake_nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, fake_nvml.NVML_AGGREGATE_ECC, fake_nvml.NVML_MEMORY_LOCATION_SRAM)
        gpus[1].ecc_counts = {key: 12_345}
        healthy, noisy = check_ecc(NvmlSession(FakeNvml(gpus)), 2, AZURE)
        assert healthy.status == PASS and "dram_corrected_aggregate=0" in healthy.detail
        assert noisy.status == FAIL and "sram_corrected_aggregate=12345" in noisy.detail


class TestRecordedOutput:
    def test_healthy_a100_passes(self):
        gpus = parse_smi_memory(sample("nvidia-smi-q-ecc-a100-healthy.txt"))
        assert list(gpus) == ["00000000:12:00.0", "00000000:8A:00.0"]
        assert all(c.ecc_enabled and c.sram_uncorrected_aggregate == 0 for c in gpus.values())
        assert {grade_memory(c, AZURE)[0] for c in gpus.values()} == {PASS}

    def test_remap_pending_after_xid_63_fails(self):
        (counters,) = parse_smi_memory(sample("nvidia-smi-q-a100-remap-pending.txt")).values()
        assert (counters.remap_pending, counters.remap_correctable, counters.dram_corrected_volatile) == (True, 1, 177)
        assert counters.retired_single_bit is None  # "N/A" on A100
        status, problems = grade_memory(counters, AZURE)
        assert status == FAIL and problems == ["row remapping pending (reset the GPU to use the spare row)"]

    def test_uncorrectable_sram_fails(self):
        (counters,) = parse_smi_memory(sample("nvidia-smi-q-ecc-sram-uncorrectable.txt")).values()
        assert (counters.sram_uncorrected_volatile, counters.sram_uncorrected_aggregate) == (1, 5)
        assert grade_memory(counters, AZURE)[0] == FAIL

    def test_remapped_rows_pending_fails(self):
        (counters,) = parse_smi_memory(sample("nvidia-smi-q-remapped-rows-uncorrectable-pending.txt")).values()
        assert (counters.remap_uncorrectable, counters.remap_pending) == (4, True)
        assert grade_memory(counters, AZURE)[0] == FAIL

    def test_azures_v100_retirement_samples(self):
        """Azure's own samples: the clean node passes; in the edited one GPUs 2, 6 and 8 (a full
        table and a retirement pending) fail as Azure's unit test expects, GPU 1 (65 pages, none
        pending) passes, GPU 4 (6 pages, pending) warns where Azure passes it."""
        clean = parse_smi_memory((REFERENCE / "test-data" / "orig_nvsmi8_output.txt").read_text())
        assert len(clean) == 8 and {grade_memory(c, EccLimits())[0] for c in clean.values()} == {PASS}
        bad = parse_smi_memory((REFERENCE / "test-data" / "bad_nvsmi8_output.txt").read_text())
        statuses = [grade_memory(c, EccLimits())[0] for c in bad.values()]
        assert statuses == [PASS, FAIL, PASS, WARN, PASS, FAIL, PASS, FAIL]


class TestNvidiaSmiFallback:
    NO_NVML = NvmlSession(None, "the NVML bindings (pip package nvidia-ml-py) are not installed")

    def test_nvidia_smi_is_read_when_nvml_is_absent(self):
        seen = []
        fake = recorded_tools(outputs={"nvidia-smi -q -d ECC": (0, sample("nvidia-smi-q-a100-remap-pending.txt"))})
        original = fake.run
        fake.run = lambda command, timeout: seen.append(command) or original(command, timeout)
        (result,) = check_ecc(self.NO_NVML, 8, AZURE, fake)
        assert seen == [ecc.SMI_QUERY]
        assert result.subject == "gpu0 00000000:10:1C.0" and result.status == FAIL and "(nvidia-smi)" in result.detail

    def test_nvidia_smi_missing_too_is_not_checked(self):
        (absent,) = check_ecc(self.NO_NVML, 8, AZURE, recorded_tools(missing=("nvidia-smi",)))
        assert absent.status == NOT_CHECKED and "nvidia-ml-py" in absent.detail
        broken = recorded_tools(outputs={"nvidia-smi -q -d ECC": (127, sample("nvidia-smi-command-not-found.txt"))})
        (result,) = check_ecc(self.NO_NVML, 8, AZURE, broken)
        assert result.status == NOT_CHECKED and "command not found" in result.detail
