"""CosmoFlow in TensorFlow/Keras with Horovod over MPI (NAG's CosmoFlow tutorial), for the TF image."""
