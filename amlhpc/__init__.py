"""`aml-hpc`: the kit as one installed command, `aml-hpc infra|jobs|images|doctor ...`.

The same command lines as `python -m infra|jobs|images` (one app each; nothing is
redefined here), usable from any folder of a project (core/project.py) once the wheel is
installed (`uv tool install`, `pip install`).
"""

from core.version import __version__

__all__ = ["__version__"]
