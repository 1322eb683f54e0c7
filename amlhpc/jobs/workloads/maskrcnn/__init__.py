"""Adapter that runs NVIDIA's Mask R-CNN (DeepLearningExamples) under Azure ML MPI (NAG's Mask R-CNN tutorial)."""
