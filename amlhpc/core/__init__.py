"""What infra, jobs and images share: the hardware catalog (kept as data with its
sources), the error type, the stack-outputs model, and the pricing, quota and region rules.

Imports no Pulumi and no azure-ai-ml, so every part can use it; `amlhpc/jobs/runtime` (which
ships alone into the training image) still imports nothing from here.
"""
