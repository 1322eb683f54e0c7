"""One Pulumi ComponentResource per concept, each with a typed Args.

Conventions (docs/contracts.md): `<Noun>Args` dataclass with a docstring per
field (default, unit, whether changing it forces replacement); `<Noun>` component with
type token `aml-hpc:<area>:<Noun>`; children named from the component's own name with
`parent=self`; `register_outputs` at the end; `ComponentError` (below) when options
contradict. Components never read `pulumi.Config`: the program passes validated config.
"""

from collections.abc import Sequence

import pulumi


class ComponentError(pulumi.RunError):
    """A component's options contradict each other. The message names the component.

    (Python's Pulumi SDK has no ResourceError; RunError stops the program without a
    Python traceback under the engine.)
    """

    def __init__(self, component: pulumi.Resource, message: str):
        super().__init__(f"{component._name}: {message}")  # noqa: SLF001 - the logical name


def inherited_depends_on(opts: pulumi.ResourceOptions | None) -> list[pulumi.Input[pulumi.Resource]]:
    """The resources a component was told to wait for, as a list its children can take:
    children do not inherit a component's depends_on. The program passes a list (or one
    resource); an Output or awaitable of a list cannot be spread here and is refused."""
    depends_on = opts.depends_on if opts else None
    if depends_on is None:
        return []
    if isinstance(depends_on, pulumi.Resource):
        return [depends_on]
    if isinstance(depends_on, Sequence):
        return list(depends_on)
    raise TypeError(f"depends_on must be a resource or a list of them, not {type(depends_on).__name__}")
