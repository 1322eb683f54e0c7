"""Run NVIDIA's Mask R-CNN training (DeepLearningExamples, PyTorch/Segmentation/MaskRCNN)
as one MPI rank per GPU, the way NAG's Mask R-CNN tutorial ran it on Azure ML.

    python -m amlhpc.jobs.workloads.maskrcnn.run --source DIR --coco DIR --iterations 1000

NVIDIA's tools/train_net.py expects torch.distributed's variables and `--local_rank`;
under Azure ML's MPI distribution only OpenMPI's exist, so this maps OMPI_COMM_WORLD_* to
RANK / WORLD_SIZE / LOCAL_RANK (MASTER_ADDR from AZ_BATCH_MASTER_NODE), links the COCO
folder where NVIDIA's dataset catalog looks (datasets/coco under the source tree) and
execs train_net.py with a benchmarking configuration. The recipe's `prepare` step clones
and builds NVIDIA's code once per node. Untested here: it needs GPUs and NVIDIA's build.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from amlhpc.jobs.runtime.base import contract


def torch_env(environ: dict[str, str]) -> dict[str, str]:
    """torch.distributed variables from OpenMPI's, and the head node from Azure ML's."""
    env = dict(environ)
    for torch_name, mpi_name in (("RANK", "OMPI_COMM_WORLD_RANK"), ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"),
                                 ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK")):
        if torch_name not in env and mpi_name in env:
            env[torch_name] = env[mpi_name]
    if "MASTER_ADDR" not in env:
        addr, _, port = env.get("AZ_BATCH_MASTER_NODE", "127.0.0.1:29500").partition(":")
        env["MASTER_ADDR"], env["MASTER_PORT"] = addr, env.get("MASTER_PORT", port or "29500")
    return env


def command(source: Path, iterations: int, images_per_gpu: int, world: int, local_rank: int, output_dir: str) -> list[str]:
    return [sys.executable, str(source / "tools" / "train_net.py"),
            "--config-file", str(source / "configs" / "e2e_mask_rcnn_R_50_FPN_1x.yaml"),
            "--local_rank", str(local_rank), "--skip-test",
            "SOLVER.MAX_ITER", str(iterations),
            "SOLVER.IMS_PER_BATCH", str(images_per_gpu * world),
            "TEST.IMS_PER_BATCH", str(world),
            "DTYPE", "float16", "OUTPUT_DIR", output_dir]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="NVIDIA Mask R-CNN under Azure ML MPI")
    p.add_argument("--source", type=Path, required=True, help="NVIDIA's MaskRCNN/pytorch folder (built by the recipe's prepare)")
    p.add_argument("--coco", help="COCO 2017 folder (default: AMLHPC_DATA_DIR_COCO)")
    p.add_argument("--iterations", type=int, default=1000)
    p.add_argument("--images-per-gpu", type=int, default=8)
    p.add_argument("--output-dir", default="outputs/maskrcnn")
    args = p.parse_args(argv)
    coco = Path(args.coco or os.environ.get(contract.data_dir_var("coco"), ""))
    train_net = args.source / "tools" / "train_net.py"
    if not train_net.is_file() or not (coco / "annotations").is_dir():
        print(f"need {train_net} (the recipe's prepare step builds it) and COCO at {coco} with annotations/", file=sys.stderr)
        return 2
    env = torch_env(dict(os.environ))
    link = args.source / "datasets" / "coco"
    link.parent.mkdir(exist_ok=True)
    if not link.exists():
        try:
            link.symlink_to(coco.resolve(), target_is_directory=True)
        except FileExistsError:  # another rank on this node linked it first
            pass
    cmd = command(args.source, args.iterations, args.images_per_gpu, int(env.get("WORLD_SIZE", "1")),
                  int(env.get("LOCAL_RANK", "0")), args.output_dir)
    os.chdir(args.source)
    os.execvpe(cmd[0], cmd, env)


if __name__ == "__main__":
    sys.exit(main())
