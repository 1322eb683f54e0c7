"""BERT masked-LM pretraining (seed 004): Hugging Face model, DeepSpeed when present."""
