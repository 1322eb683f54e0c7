"""BERT masked-LM pretraining (Azure's large-scale training guide): Hugging Face model, DeepSpeed when present."""
