"""One Pulumi ComponentResource per concept, each with a typed Args.

Conventions (docs/contracts.md, STYLE.md 2): `<Noun>Args` dataclass with a docstring per
field (default, unit, whether changing it forces replacement); `<Noun>` component with
type token `aml-hpc:<area>:<Noun>`; children named from the component's own name with
`parent=self`; `register_outputs` at the end; `pulumi.ResourceError` when options
contradict. Components never read `pulumi.Config`: the program passes validated config.
"""
