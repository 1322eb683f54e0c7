"""The SKU catalog: complete for the sizes we promise, internally consistent, pure lookups."""

from __future__ import annotations

import pytest

from amlhpc.core import skus

REQUIRED = {
    # the sizes of the published guides this platform follows (NAG's CosmoFlow and Mask R-CNN
    # tutorials, Microsoft's NDv4 performance article, Azure's large-scale training guide)
    "Standard_ND40rs_v2", "Standard_ND96asr_v4", "Standard_ND96amsr_A100_v4", "Standard_ND96isr_H100_v5",
    "Standard_NC24rs_v3", "Standard_NC24s_v3",
    # H200, and a size without InfiniBand (NC A100 v4)
    "Standard_ND96isr_H200_v5", "Standard_NC24ads_A100_v4",
    # every current Azure GPU training size (Microsoft Learn GPU sizes; Azure/azhpc-images and
    # Azure/azurehpc-health-checks carry each of them)
    "Standard_ND96isr_MI300X_v5", "Standard_ND128isr_NDR_GB200_v6", "Standard_ND128isr_GB300_v6",
    "Standard_NC40ads_H100_v5", "Standard_NC80adis_H100_v5", "Standard_NC48ads_A100_v4",
}


class TestCatalogContents:
    def test_every_promised_size_is_present(self):
        assert REQUIRED <= set(skus.CATALOG)

    @pytest.mark.parametrize("name", sorted(skus.CATALOG))
    def test_size_is_self_consistent(self, name):
        sku = skus.get(name)
        assert sku.name == name
        assert sku.gpus > 0 and sku.vcpus > 0 and sku.gpu_memory_gib > 0
        assert sku.gpu_peak_dense_tflops > 0 and sku.gpu_memory_gbytes_per_s > 0
        assert sku.infiniband == (sku.ib_generation is not None) == (sku.ib_gbits_per_s_per_hca > 0)
        assert sku.quota_family
        assert (sku.nvme_devices == 0) == (sku.nvme_total_gib == 0)
        if sku.price is not None:
            assert sku.price.usd_per_hour > 0 and sku.price.region and sku.price.as_of and sku.price.source
        if sku.numa is not None:
            listed = [g for d in sku.numa for g in d.gpu_ids]
            assert sorted(listed) == list(range(sku.gpus)), "each GPU in exactly one NUMA domain"

    @pytest.mark.parametrize("name", sorted(skus.CATALOG))
    def test_rdma_sizes_have_an_r_in_the_name(self, name):
        """Azure's size naming: RDMA (InfiniBand) sizes have an "r" in the size suffix."""
        suffix = name.split("_")[1]  # e.g. ND96asr, NC24s, NC24ads
        letters = suffix.lstrip("NDCV").lstrip("0123456789")
        assert ("r" in letters) == skus.get(name).infiniband

    def test_seed_000_price_for_nd40rs_v2(self):
        price = skus.get("Standard_ND40rs_v2").price
        assert price is not None and price.usd_per_hour == pytest.approx(26.438)

    def test_published_health_thresholds(self):
        a100 = skus.get("Standard_ND96asr_v4").health
        assert a100.nccl_allreduce_busbw_gbytes_per_s_min == 228 and a100.nccl_allreduce_message_bytes == 8 << 30
        assert a100.h2d_gbytes_per_s_min == 21 and a100.ib_write_gbits_per_s_per_hca_min == 180
        h100 = skus.get("Standard_ND96isr_H100_v5").health
        assert h100.nccl_allreduce_busbw_gbytes_per_s_min == 460 and h100.nccl_allreduce_message_bytes == 16 << 30
        assert h100.h2d_gbytes_per_s_min == 48
        (band,) = h100.multinode
        assert (band.scope, band.busbw_gbytes_per_s, band.sharp) == ("infiniband", (450, 400, 300), True)
        assert h100.gemm_tflops == (769, 742, 715) and h100.gemm_source == "azure-sku-baseline"
        assert skus.get("Standard_NC24rs_v3").health.nccl_allreduce_busbw_gbytes_per_s_min is None


class TestDerivedFacts:
    def test_nd96asr_v4_gpu_order_follows_numa(self):
        """the NDv4 performance article: CUDA_VISIBLE_DEVICES=2,3,0,1,6,7,4,5 with two GPUs per NUMA domain."""
        sku = skus.get("Standard_ND96asr_v4")
        assert sku.gpu_order == (2, 3, 0, 1, 6, 7, 4, 5)
        assert all(len(d.gpu_ids) == 2 for d in sku.numa)

    def test_unknown_topology_has_no_order(self):
        assert skus.get("Standard_NC24s_v3").gpu_order is None

    def test_infiniband_per_gpu(self):
        assert skus.get("Standard_ND96isr_H100_v5").ib_gbits_per_s_per_gpu == 400
        assert skus.get("Standard_ND40rs_v2").ib_gbits_per_s_per_gpu == 12.5  # one EDR port for 8 GPUs
        assert skus.get("Standard_NC24s_v3").ib_gbits_per_s_per_gpu == 0


class TestLookups:
    def test_case_insensitive_get_returns_canonical(self):
        assert skus.get("standard_nd96asr_v4").name == "Standard_ND96asr_v4"

    def test_unknown_size_suggests_near_match(self):
        with pytest.raises(skus.UnknownSkuError) as info:
            skus.get("Standard_ND96asr_v5")
        assert "Standard_ND96asr_v4" in info.value.suggestions
        assert "did you mean" in str(info.value)

    def test_nonsense_has_no_suggestion(self):
        with pytest.raises(skus.UnknownSkuError) as info:
            skus.get("banana")
        assert info.value.suggestions == []


class TestCatalogData:
    """The catalog is data (amlhpc/core/catalog/skus.toml): every figure cites a known source, and
    a malformed entry fails loudly, naming the entry and the key."""

    @pytest.mark.parametrize("name", sorted(skus.CATALOG))
    def test_every_source_is_listed_with_title_url_and_date(self, name):
        sku = skus.get(name)
        cited = [sku.facts_source, *sku.health.sources()] + ([sku.price.source] if sku.price else [])
        for source_id in cited:
            source = skus.SOURCES[source_id]
            # the project's own measurements cite the committed result file instead of a web page
            own = source_id.startswith("aml-hpc-") and (skus.CATALOG_FILE.parents[3] / source.url).is_file()
            assert source.title and (source.url.startswith("https://") or own) and source.as_of

    def test_unknown_key_is_named(self, tmp_path):
        text = skus.CATALOG_FILE.read_text().replace("gpu_memory_gib = 32", "gpu_memory_gb = 32", 1)
        (tmp_path / "skus.toml").write_text(text)
        with pytest.raises(skus.CatalogError, match=r"sku\[0\] \(Standard_ND40rs_v2\): unknown key\(s\) gpu_memory_gb"):
            skus._load(tmp_path / "skus.toml")

    def test_unknown_source_is_named(self, tmp_path):
        text = skus.CATALOG_FILE.read_text().replace('source = "nag-cosmoflow"', 'source = "nag-cosmoflw"', 1)
        (tmp_path / "skus.toml").write_text(text)
        with pytest.raises(skus.CatalogError, match=r"price.source: source 'nag-cosmoflw' is not in \[sources\]"):
            skus._load(tmp_path / "skus.toml")

    def test_records_are_frozen(self):
        with pytest.raises(AttributeError):
            skus.get("Standard_ND96asr_v4").gpus = 4  # type: ignore[misc]


class TestPassMarksAreAzures:
    """Every size's health pass marks equal Azure's node health checks for it: reference copies
    of Azure/azurehpc-health-checks conf/<size>.conf at commit 0e0a1ac (read 2026-11-23) in
    tests/reference/azurehpc-health-checks/conf/."""

    CONF = __import__("pathlib").Path(__file__).parent / "reference" / "azurehpc-health-checks" / "conf"

    @staticmethod
    def checks(path) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for line in path.read_text().splitlines():
            if "||" in line and not line.lstrip().startswith("#"):
                words = line.split("||", 1)[1].split()
                found.setdefault(words[0], words[1:])
        return found

    NO_CONF = {"Standard_ND128isr_NDR_GB200_v6", "Standard_ND128isr_GB300_v6", "Standard_ND128isrG5_GB300_v6",
               "Standard_ND96is_MI300X_v5"}
    """Azure publishes no conf for the GB-family sizes and ND96is_MI300X_v5 at the reference commit."""

    @pytest.mark.parametrize("name", sorted(skus.CATALOG))
    def test_equal_to_azures_conf(self, name):
        sku = skus.get(name)
        conf = self.CONF / f"{name.removeprefix('Standard_').lower()}.conf"
        if name in self.NO_CONF:
            assert not conf.exists() and not skus.SOURCES[sku.health.source].url.endswith(".conf")
            health = sku.health
            assert (health.h2d_gbytes_per_s_min, health.nccl_allreduce_busbw_gbytes_per_s_min,
                    health.ib_write_gbits_per_s_per_hca_min, health.ecc_dram_limit) == (None, None, None, None)
            return
        assert conf.is_file(), f"no reference copy of Azure's conf for {name}"
        azure, health = self.checks(conf), sku.health
        assert skus.SOURCES[health.source].url.endswith(f"conf/{conf.name}")
        ecc = azure.get("check_gpu_ecc", [])
        assert (health.ecc_dram_limit, health.ecc_sram_correctable_limit) == (
            (int(ecc[0]), int(ecc[1])) if len(ecc) == 2 else (None, None))
        count = azure.get("check_gpu_count", [])
        assert int(count[0]) == sku.gpus and (count[1:] == ["rocm"]) == (sku.gpu_vendor == "amd")
        bw = azure.get("check_gpu_bw", [])
        assert health.h2d_gbytes_per_s_min == health.d2h_gbytes_per_s_min == (float(bw[0]) if bw else None)
        if len(bw) > 1 and sku.gpus > 1:
            assert health.p2p_gbytes_per_s_min == float(bw[1])
        nccl = azure.get("check_nccl_allreduce") or azure.get("check_rccl_allreduce")
        assert health.nccl_allreduce_busbw_gbytes_per_s_min == (float(nccl[0]) if nccl else None)
        if nccl:
            size = {"8G": 8 << 30, "16G": 16 << 30}[nccl[2]]
            assert health.nccl_allreduce_message_bytes == size
        gdr, non_gdr = azure.get("check_ib_bw_gdr"), azure.get("check_ib_bw_non_gdr")
        expected_ib = float((gdr or non_gdr)[0]) if (gdr or non_gdr) else None
        assert health.ib_write_gbits_per_s_per_hca_min == expected_ib
        assert health.ib_write_gpudirect == (non_gdr is None)
        if non_gdr:  # azure_ib_write_bw_non_gdr.nhc: 1 MiB messages when the conf gives no size
            assert health.ib_write_message_bytes == (int(non_gdr[1]) if len(non_gdr) > 1 else 1 << 20)
        nvme = azure.get("check_nvme_count")
        assert health.nvme_count == (int(nvme[0]) if nvme else None)
        assert health.nvlink_check == ("check_nvlink_status" in azure)

    def test_h200_infiniband_mark_is_360(self):
        assert skus.get("Standard_ND96isr_H200_v5").health.ib_write_gbits_per_s_per_hca_min == 360

    def test_retired_sizes_carry_date_and_notice(self):
        for name in ("Standard_NC24s_v3", "Standard_NC24rs_v3"):
            sku = skus.get(name)
            assert sku.retired == "2025-09-30" and "retired by Azure on 2025-09-30" in sku.retirement
            assert skus.SOURCES[sku.retired_source].url.startswith("https://learn.microsoft.com/")
        assert skus.get("Standard_ND96isr_H100_v5").retired is None


class TestNewGenerations:
    """The facts the review found missing or drifted, each against its published figure."""

    def test_drift_fixed_temp_disks_and_network(self):
        """Microsoft Learn size tables: ND H100/H200 v5 1024 GiB temp disk and 80,000 Mb/s;
        ND96asr_v4 6000 GiB local storage."""
        for name in ("Standard_ND96isr_H100_v5", "Standard_ND96isr_H200_v5"):
            assert skus.get(name).temp_disk_gib == 1024 and skus.get(name).storage_nic_gbits_per_s == 80
        assert skus.get("Standard_ND96asr_v4").temp_disk_gib == 6000

    @pytest.mark.parametrize("name, bf16, fp8", [
        ("Standard_ND96isr_H100_v5", 989, 1979), ("Standard_ND96asr_v4", 312, None), ("Standard_ND40rs_v2", None, None),
        ("Standard_ND96isr_MI300X_v5", 1307.4, 2614.9), ("Standard_ND128isr_GB300_v6", 2500, 5000),
        ("Standard_NC40ads_H100_v5", 835.5, 1670.5),
    ])
    def test_peak_dense_rate_per_dtype(self, name, bf16, fp8):
        """Dense (no sparsity) tensor rates from the vendors' datasheets: the sparse figures halved."""
        sku = skus.get(name)
        assert (sku.peak_tflops("bf16"), sku.peak_tflops("fp8")) == (bf16, fp8)
        assert sku.gpu_peak_dense_tflops == sku.peak_tflops(sku.gpu_gemm_dtype) > 0
        assert skus.SOURCES[sku.peak_source].url.startswith("https://")

    def test_architectures(self):
        assert skus.get("Standard_ND40rs_v2").gpu_arch == "sm_70"
        assert skus.get("Standard_ND96isr_MI300X_v5").gpu_vendor == "amd"
        assert skus.get("Standard_ND96isr_MI300X_v5").gpu_arch == "gfx942"
        for name in ("Standard_ND128isr_NDR_GB200_v6", "Standard_ND128isr_GB300_v6"):
            sku = skus.get(name)
            assert sku.host_arch == "aarch64" and sku.gpus == 4
            assert (sku.nvlink_domain.gpus, sku.nvlink_domain.vms, sku.nvlink_domain.imex) == (72, 18, True)

    def test_quota_families_are_the_services_names(self):
        """The family ids Azure's SKU list reports (SkyPilot's fetcher maps the same ones)."""
        assert skus.get("Standard_ND96isr_MI300X_v5").quota_family == "standardNDISv5MI300XFamily"
        assert skus.get("Standard_ND128isr_NDR_GB200_v6").quota_family == "standardNDISRGB200V6NDRFamily"
        assert skus.get("Standard_ND128isr_GB300_v6").quota_family == "standardNDISRGB300V6Family"
        assert skus.get("Standard_NC40ads_H100_v5").quota_family == "StandardNCadsH100v5Family"

    @pytest.mark.parametrize("name", ["Standard_ND96isr_MI300X_v5", "Standard_ND128isr_NDR_GB200_v6",
                                      "Standard_ND128isr_GB300_v6"])
    def test_sizes_azure_ml_cannot_run_say_why_and_where_else(self, name):
        sku = skus.get(name)
        assert not sku.azureml.amlcompute and sku.azureml.reason and sku.azureml.elsewhere
        assert "cannot run" in sku.azureml_problem and sku.azureml.reason in sku.azureml_problem

    def test_gb300_gemm_mark_is_a_60_second_sustained_run(self):
        health = skus.get("Standard_ND128isr_GB300_v6").health
        assert health.gemm_tflops == (1850, 1785, 1720) and health.gemm_method == "sustained" and health.gemm_seconds == 60

    @pytest.mark.parametrize("name", ["Standard_ND96isr_H100_v5", "Standard_ND96isr_H200_v5", "Standard_ND128isr_GB300_v6"])
    def test_azure_baseline_gemm_marks_say_ubergemm_measured_them(self, name):
        health = skus.get(name).health
        assert health.gemm_source == "azure-sku-baseline" and health.gemm_tool == "ubergemm"

    def test_h200_has_a_torch_mark_from_the_measurement(self):
        health = skus.get("Standard_ND96isr_H200_v5").health
        assert health.gemm_torch_tflops == (681.3, 657.5, 633.6) and health.gemm_torch_source == "aml-hpc-h200-gemm"
        assert "2026-11-26" == skus.SOURCES["aml-hpc-h200-gemm"].as_of
        assert skus.get("Standard_ND96isr_H100_v5").health.gemm_torch_tflops is None
        assert skus.get("Standard_ND96asr_v4").health.gemm_tool == "torch"  # mamf-finder is torch.matmul

    def test_a_bad_gemm_tool_is_named(self, tmp_path):
        text = skus.CATALOG_FILE.read_text().replace('gemm_tool = "ubergemm"', 'gemm_tool = "dcgmi"', 1)
        (tmp_path / "skus.toml").write_text(text)
        with pytest.raises(skus.CatalogError, match=r"Standard_ND96isr_H100_v5.*health.gemm_tool 'dcgmi' is not one of torch, ubergemm"):
            skus._load(tmp_path / "skus.toml")

    def test_a_torch_mark_needs_its_source_and_falling_order(self, tmp_path):
        text = skus.CATALOG_FILE.read_text()
        (tmp_path / "skus.toml").write_text(text.replace('gemm_torch_source = "aml-hpc-h200-gemm"\n', "", 1))
        with pytest.raises(skus.CatalogError, match="gemm_torch_source is missing"):
            skus._load(tmp_path / "skus.toml")
        (tmp_path / "skus.toml").write_text(text.replace("[681.3, 657.5, 633.6]", "[633.6, 657.5, 681.3]", 1))
        with pytest.raises(skus.CatalogError, match="gemm_torch_tflops must be .* falling order"):
            skus._load(tmp_path / "skus.toml")

    def test_a_torch_mark_beside_a_torch_mark_is_refused(self, tmp_path):
        text = skus.CATALOG_FILE.read_text().replace('gemm_tool = "ubergemm"\ngemm_measured_on = "Standard_ND96isr_H100_v5"\n# torch.matmul',
                                                     "# torch.matmul", 1)
        (tmp_path / "skus.toml").write_text(text)
        with pytest.raises(skus.CatalogError, match="Standard_ND96isr_H200_v5.*gemm_torch_tflops is only for an ubergemm mark"):
            skus._load(tmp_path / "skus.toml")

    def test_a_sustained_mark_without_its_duration_fails_at_load(self, tmp_path):
        text = skus.CATALOG_FILE.read_text().replace("gemm_seconds = 60.0\n", "", 1)
        (tmp_path / "skus.toml").write_text(text)
        with pytest.raises(skus.CatalogError, match="gemm_seconds is missing"):
            skus._load(tmp_path / "skus.toml")

    def test_a_wrong_architecture_fails_at_load(self, tmp_path):
        text = skus.CATALOG_FILE.read_text().replace('gpu_arch = "gfx942"', 'gpu_arch = "sm_94"', 1)
        (tmp_path / "skus.toml").write_text(text)
        with pytest.raises(skus.CatalogError, match="does not belong to the size's amd GPU"):
            skus._load(tmp_path / "skus.toml")
