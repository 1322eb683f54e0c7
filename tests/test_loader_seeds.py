"""DataLoader worker seeds in the exact-resume state (amlhpc/jobs/workloads/resume.py: LoaderSeeds,
SeededSamples): a run stopped at any step and resumed with new loader objects from the saved
state yields the batches - the samples and the random draws made in the workers - of a run
that was never stopped. On CPU, with real worker processes."""

from __future__ import annotations

import json
import random

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, get_worker_info  # noqa: E402

from amlhpc.jobs.workloads.resume import LoaderSeeds, SeededSamples, ShardSampler  # noqa: E402

LENGTH, BATCH, EPOCHS = 24, 4, 2
STEPS = LENGTH // BATCH


class Noisy:
    """A sample with the draws an augmentation would make in the worker that loads it."""

    def __len__(self) -> int:
        return LENGTH

    def __getitem__(self, index: int):
        return torch.tensor([float(index), torch.rand(()).item(), random.random()], dtype=torch.float64)


class WorkerSeed(Noisy):
    def __getitem__(self, index: int):
        worker = get_worker_info()
        return torch.tensor([float(index), float(worker.seed - worker.id)], dtype=torch.float64)


def run(*, stop_at: int | None = None, state: dict | None = None, workers: int = 2, persistent: bool = False,
        seeded: bool = True, dataset=None):
    """Batches of EPOCHS epochs (or up to `stop_at`, with the state a checkpoint would hold then)."""
    sampler, seeds = ShardSampler(LENGTH, BATCH, seed=7), LoaderSeeds(11)
    if state is not None:
        state = json.loads(json.dumps(state))  # as the checkpoint's trainer record holds it
        sampler.load_state_dict(state["sampler"])
        seeds.load_state_dict(state["loader"])
    data = dataset or (SeededSamples(Noisy(), seeds) if seeded else Noisy())
    generator = seeds.generator if seeded else torch.Generator().manual_seed(11)  # what cosmoflow had
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler, num_workers=workers, generator=generator,
                        persistent_workers=persistent)
    out: list[list[float]] = []
    first = sampler.epoch + (1 if sampler.position >= sampler.steps_per_epoch * sampler.batch else 0)
    for epoch in range(first, EPOCHS):
        sampler.set_epoch(epoch)
        batches = seeds.iterate(loader, epoch) if seeded or persistent else iter(loader)
        for batch in batches:
            out.append(batch.tolist())
            sampler.step_done()
            if stop_at is not None and len(out) == stop_at:
                return out, {"sampler": sampler.state_dict(), "loader": seeds.state_dict()}
    return out, None


@pytest.mark.parametrize("stop_at, workers", [(3, 2), (STEPS, 2), (STEPS + 4, 2), (STEPS + 4, 0)],
                         ids=["mid-epoch 0", "epoch boundary", "mid-epoch 1", "mid-epoch 1 without workers"])
def test_a_resumed_run_draws_what_an_uninterrupted_one_drew(stop_at, workers):
    whole, _ = run(workers=workers)
    assert len(whole) == EPOCHS * STEPS
    before, state = run(workers=workers, stop_at=stop_at)
    after, _ = run(workers=workers, state=state)
    assert before + after == whole
    epochs = [sorted(x[0] for b in whole[e * STEPS:(e + 1) * STEPS] for x in b) for e in range(EPOCHS)]
    assert epochs[0] == epochs[1] == list(map(float, range(LENGTH))), "every sample once per epoch"
    draws = [x[1] for b in whole for x in b]
    assert len(set(draws)) == len(draws), "each sample of each epoch draws afresh"


def test_without_it_the_workers_of_a_resumed_run_draw_otherwise():
    """What the loader's own generator gave before: a resumed run's first iterator drew the first
    base seed, not the current epoch's, and its workers were dealt other batches."""
    whole, _ = run(seeded=False)
    before, state = run(seeded=False, stop_at=STEPS + 2)
    after, _ = run(seeded=False, state=state)
    assert [[x[0] for x in b] for b in before + after] == [[x[0] for x in b] for b in whole], "the order was exact"
    assert before + after != whole, "the workers' draws were not"


def test_persistent_workers_get_the_seed_the_saved_run_gave_them():
    whole, _ = run(persistent=True, dataset=WorkerSeed())
    assert len({x[1] for b in whole for x in b}) == 1, "persistent workers are seeded once"
    _, state = run(persistent=True, dataset=WorkerSeed(), stop_at=STEPS + 2)
    after, _ = run(persistent=True, dataset=WorkerSeed(), state=state)
    assert {x[1] for b in after for x in b} == {whole[0][0][1]}


def test_per_sample_seeds_refuse_persistent_workers():
    seeds = LoaderSeeds(1)
    loader = DataLoader(SeededSamples(Noisy(), seeds), batch_size=BATCH, num_workers=1, persistent_workers=True)
    with pytest.raises(ValueError, match="persistent_workers=False"):
        seeds.iterate(loader, 0)
