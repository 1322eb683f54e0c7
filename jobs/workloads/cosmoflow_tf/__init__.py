"""CosmoFlow in TensorFlow/Keras with Horovod over MPI (seed 000), for the TF image."""
