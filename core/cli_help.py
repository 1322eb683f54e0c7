"""Help screens show flags as flags: `--json`, not `--json <bool>`.

Typer's rich help (typer 0.29, `rich_utils._print_options_panel`) prints every option's
type after it, `<bool>` for flags included, although a flag takes no value (its plain-text
help, `TyperOption.get_help_record`, already leaves flags bare). `flags_without_types()`
makes the rich help agree: a flag or counter shows no type. Every CLI of the project (jobs,
infra, images) calls it at import; tests/test_cli_help.py renders every command's help.
"""

from __future__ import annotations

from typer.core import TyperOption

_PATCHED = "_amlhpc_flags_without_types"


def flags_without_types() -> None:
    """Idempotent: wraps TyperOption.display_type_rich so flags report no type."""
    if getattr(TyperOption, _PATCHED, False):
        return
    original = TyperOption.display_type_rich

    def display_type_rich(self, ctx):
        if self.is_flag or self.count:
            return None
        return original(self, ctx)

    TyperOption.display_type_rich = display_type_rich
    setattr(TyperOption, _PATCHED, True)
