"""One Pulumi ComponentResource per concept, each with a typed Args.

Conventions (docs/contracts.md): `<Noun>Args` dataclass with a docstring per
field (default, unit, whether changing it forces replacement); `<Noun>` component with
type token `aml-hpc:<area>:<Noun>`; children named from the component's own name with
`parent=self`; `register_outputs` at the end; `ComponentError` (below) when options
contradict. Components never read `pulumi.Config`: the program passes validated config.
"""

import pulumi


class ComponentError(pulumi.RunError):
    """A component's options contradict each other. The message names the component.

    (Python's Pulumi SDK has no ResourceError; RunError stops the program without a
    Python traceback under the engine.)
    """

    def __init__(self, component: pulumi.Resource, message: str):
        super().__init__(f"{component._name}: {message}")  # noqa: SLF001 - the logical name
