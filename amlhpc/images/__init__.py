"""aml-hpc training images: NGC-based Dockerfiles with the InfiniBand user space.

`amlhpc.images.pins` reads the one pins file, `amlhpc.images.catalog` names the images and computes
their content-hash tags (pure: the Pulumi program imports it to register Azure ML
environments), `amlhpc.images.context` assembles and hashes each build context, `amlhpc.images.build`
builds missing tags in ACR through the az CLI, and `python -m amlhpc.images` is the CLI.
See docs/images.md.
"""
