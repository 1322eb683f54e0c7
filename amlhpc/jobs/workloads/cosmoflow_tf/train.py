"""CosmoFlow in TensorFlow/Keras with Horovod over MPI (NAG's CosmoFlow tutorial), one process per GPU.

    python -m amlhpc.jobs.workloads.cosmoflow_tf.train --input cosmoflow --epochs 48 --batch-size 4

Same data contract as the PyTorch port: AMLHPC_DATA_DIR_<INPUT> / AMLHPC_FILE_LIST_<INPUT>
(file selection in amlhpc/jobs/workloads/cosmoflow/data.py, reused), records parsed with
tf.io.parse_single_example (x: raw int16 [D, D, D, 4], y: 4 floats), log1p as the
reference does. Horovod: DistributedOptimizer, initial broadcast from rank 0, rank 0 alone
writes checkpoints (AMLHPC_CHECKPOINT_DIR) and TensorBoard logs. Needs the TF image
(tensorflow + horovod); not runnable on the CPU test machine (no TensorFlow there).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from amlhpc.jobs.runtime.base import contract
from amlhpc.jobs.workloads.cosmoflow import data as files


def parse(argv):
    p = argparse.ArgumentParser(description="CosmoFlow (TensorFlow + Horovod)")
    p.add_argument("--input", default="cosmoflow")
    p.add_argument("--data-dir")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.001)
    p.add_argument("--conv-size", type=int, default=32)
    p.add_argument("--n-conv-layers", type=int, default=5)
    p.add_argument("--output-dir", default="outputs")
    return p.parse_args(argv)


def build_model(tf, volume: int, conv_size: int, n_conv: int):
    layers = tf.keras.layers
    model = tf.keras.Sequential([layers.Input((volume, volume, volume, 4))])
    for i in range(n_conv):
        model.add(layers.Conv3D(conv_size * 2 ** i, 2, padding="same"))
        model.add(layers.LeakyReLU(0.3))
        model.add(layers.MaxPool3D(2))
    model.add(layers.Flatten())
    for units in (128, 64):
        model.add(layers.Dense(units))
        model.add(layers.LeakyReLU(0.3))
    model.add(layers.Dense(4, activation="tanh"))
    model.add(layers.Rescaling(1.2))
    return model


def main(argv=None) -> int:
    args = parse(argv)
    try:
        import horovod.tensorflow.keras as hvd
        import tensorflow as tf
    except ImportError as exc:
        print(f"this workload needs the TensorFlow image with Horovod ({exc})", file=sys.stderr)
        return 2
    hvd.init()
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank() % len(gpus)], "GPU")
        tf.config.experimental.set_memory_growth(gpus[hvd.local_rank() % len(gpus)], True)
    root = files.data_dir(args.input, args.data_dir)
    train, _ = files.split(files.rank_files(root, args.input, hvd.rank(), hvd.size()))
    if not train:
        print(f"rank {hvd.rank()}: no training files under {root}", file=sys.stderr)
        return 2
    volume = files.read_samples(train[0])[0][0].shape[0]

    def parse_record(record):
        parsed = tf.io.parse_single_example(record, {"x": tf.io.FixedLenFeature([], tf.string),
                                                     "y": tf.io.FixedLenFeature([4], tf.float32)})
        x = tf.reshape(tf.io.decode_raw(parsed["x"], tf.int16), (volume, volume, volume, 4))
        return tf.math.log1p(tf.cast(x, tf.float32)), parsed["y"]

    compression = "GZIP" if train[0].name.endswith(".gz") else None
    dataset = (tf.data.TFRecordDataset([str(p) for p in train], compression_type=compression)
               .map(parse_record, num_parallel_calls=tf.data.AUTOTUNE).shuffle(64)
               .batch(args.batch_size, drop_remainder=True).repeat().prefetch(tf.data.AUTOTUNE))
    model = build_model(tf, volume, args.conv_size, args.n_conv_layers)
    optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(args.lr * hvd.size(), momentum=0.9))
    model.compile(optimizer=optimizer, loss="mse", metrics=["mae"])
    steps = max(1, min(hvd.allreduce(tf.constant(len(train) // args.batch_size), op=hvd.Min).numpy().item(), 10**9))
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback()]
    if hvd.rank() == 0:
        ckpt = Path(os.environ.get(contract.CHECKPOINT_DIR) or "outputs/checkpoints")
        ckpt.mkdir(parents=True, exist_ok=True)
        callbacks += [tf.keras.callbacks.ModelCheckpoint(str(ckpt / "ckpt-{epoch:04d}.weights.h5"), save_weights_only=True),
                      tf.keras.callbacks.TensorBoard(str(Path(args.output_dir) / "tensorboard"))]
    resume = os.environ.get(contract.RESUME_DIR)
    initial_epoch = 0
    if resume and sorted(Path(resume).glob("ckpt-*.weights.h5")):
        latest = sorted(Path(resume).glob("ckpt-*.weights.h5"))[-1]
        model.load_weights(str(latest))
        initial_epoch = int(latest.name.split("-")[1].split(".")[0])
    model.fit(dataset, epochs=args.epochs, initial_epoch=initial_epoch, steps_per_epoch=steps, callbacks=callbacks,
              verbose=2 if hvd.rank() == 0 else 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
