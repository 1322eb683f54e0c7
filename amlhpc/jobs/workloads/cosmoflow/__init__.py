"""CosmoFlow (MLPerf HPC) in PyTorch: TFRecord reader without TensorFlow, synthetic data
generator in the dataset's naming pattern, the 3D CNN, and the DDP training script."""
