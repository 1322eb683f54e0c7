"""amlhpc.jobs.runtime.base.ranks: rank, local rank, world, node index from each launcher's variables."""

from __future__ import annotations

import pytest

from amlhpc.jobs.runtime.base import ranks
from amlhpc.jobs.runtime.base.errors import RuntimeInputError

TORCH = {"RANK": "11", "LOCAL_RANK": "3", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}
OMPI = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_SIZE": "12",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
HOROVOD = {"HOROVOD_RANK": "2", "HOROVOD_LOCAL_RANK": "0", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_SIZE": "2"}
PMI = {"PMI_RANK": "7", "MPI_LOCALRANKID": "3", "PMI_SIZE": "8", "MPI_LOCALNRANKS": "4"}


class TestFromEnv:
    @pytest.mark.parametrize(("env", "source", "expected"), [
        (TORCH, "torch", (11, 3, 16, 8, 1, 2)),
        (OMPI, "openmpi", (5, 1, 12, 4, 1, 3)),
        (HOROVOD, "horovod", (2, 0, 4, 2, 1, 2)),
        (PMI, "pmi", (7, 3, 8, 4, 1, 2)),
    ])
    def test_each_launcher(self, env, source, expected):
        """Every supported launcher's variables give rank, local rank, sizes and node index = rank // local size."""
        r = ranks.from_env(env)
        assert r.source == source
        assert (r.rank, r.local_rank, r.world_size, r.local_size, r.node_index, r.node_count) == expected

    def test_no_variables_is_a_single_process(self):
        r = ranks.from_env({})
        assert (r.rank, r.local_rank, r.world_size, r.local_size, r.node_index, r.source) == (0, 0, 1, 1, 0, "single")
        assert r.is_node_leader

    def test_torch_wins_over_mpi(self):
        """torchrun under mpirun: the torch variables describe the processes that train."""
        assert ranks.from_env({**OMPI, **TORCH}).source == "torch"

    def test_incomplete_set_names_the_missing_variables(self):
        with pytest.raises(ranks.RankError) as caught:
            ranks.from_env({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4"})
        text = str(caught.value)
        assert "OMPI_COMM_WORLD_LOCAL_RANK" in text and "OMPI_COMM_WORLD_LOCAL_SIZE" in text
        assert "fix:" in text
        assert isinstance(caught.value, RuntimeInputError)

    def test_non_integer_names_variable_and_value(self):
        with pytest.raises(ranks.RankError, match=r"LOCAL_RANK: 'x' is not an integer"):
            ranks.from_env({**TORCH, "LOCAL_RANK": "x"})

    def test_azure_ml_pytorch_without_local_world_size(self):
        """Azure ML's pytorch distribution sets no LOCAL_WORLD_SIZE: derived from AZUREML_NODE_COUNT."""
        env = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "AZUREML_NODE_COUNT": "2"}
        r = ranks.from_env(env)
        assert (r.local_size, r.node_index) == (4, 1)

    def test_missing_local_world_size_without_node_count_is_an_error(self):
        with pytest.raises(ranks.RankError, match="LOCAL_WORLD_SIZE"):
            ranks.from_env({"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8"})


class TestValidation:
    def test_world_not_multiple_of_local(self):
        with pytest.raises(ranks.RankError, match=r"WORLD_SIZE: 10 is not a multiple of LOCAL_WORLD_SIZE=4"):
            ranks.from_env({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "10", "LOCAL_WORLD_SIZE": "4"})

    def test_rank_out_of_range(self):
        with pytest.raises(ranks.RankError, match=r"RANK: 16 is outside 0..15"):
            ranks.from_env({**TORCH, "RANK": "16"})

    def test_round_robin_placement_is_rejected(self):
        """--map-by node puts rank 1 on the second node: rank // local size would be wrong."""
        with pytest.raises(ranks.RankError, match="block placement"):
            ranks.from_env({"RANK": "1", "LOCAL_RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"})


class TestRunId:
    def test_precedence_and_sanitising(self):
        env = {"AZUREML_RUN_ID": "job/1 2", "TORCHELASTIC_RUN_ID": "t"}
        assert ranks.run_id_from(env) == "job_1_2"
        assert ranks.run_id_from({"AMLHPC_RUN_ID": "mine", **env}) == "job_1_2", "Azure ML's id comes first"
        assert ranks.run_id_from({"AMLHPC_RUN_ID": "mine", "TORCHELASTIC_RUN_ID": "t"}) == "mine"
        assert ranks.run_id_from({"TORCHELASTIC_RUN_ID": "none"}) == "default", "torchrun's placeholder is no id"
        assert ranks.run_id_from({}) == "default"

    def test_carried_on_ranks(self):
        assert ranks.from_env({**TORCH, "PMIX_NAMESPACE": "prterun-host-123@1"}).run_id == "prterun-host-123_1"


class TestNodeHelpers:
    @pytest.mark.parametrize("local_size", [1, 2, 3, 8])
    def test_node_index_is_integer_division(self, local_size):
        world = local_size * 5
        for rank in range(world):
            r = ranks.validated(rank, rank % local_size, world, local_size)
            assert r.node_index == rank // local_size
            assert rank in r.ranks_on_node(r.node_index)
