"""The version of aml-hpc: the one place it is written.

The wheel's metadata (pyproject.toml reads it through hatchling), every `--version` and
the run reports take it from here. Releases are listed in CHANGELOG.md.
"""

__version__ = "0.1.0"
