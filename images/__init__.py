"""aml-hpc training images: NGC-based Dockerfiles with the InfiniBand user space.

`images.pins` reads the one pins file, `images.catalog` names the images and computes
their content-hash tags (pure: the Pulumi program imports it to register Azure ML
environments), `images.context` assembles and hashes each build context, `images.build`
builds missing tags in ACR through the az CLI, and `python -m images` is the CLI.
See docs/images.md.
"""
