"""Adapter that runs NVIDIA's Mask R-CNN (DeepLearningExamples) under Azure ML MPI (seed 002)."""
