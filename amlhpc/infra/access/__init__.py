"""The access program: the CI identities, their GitHub federated credentials and roles, the
custom role definitions, the per-environment Pulumi state containers and the environments'
resource groups - everything the permission model (amlhpc/core/catalog/permissions.toml) marks
`granted_by = "access-setup"`, declared by a small Pulumi program of its own so nobody grants
by hand from prose.

A platform administrator (Owner of the subscription) runs it once per subscription, and
again when the model's CI rights or custom roles change: `scripts/access-setup.sh up`
(docs/deploying.md, "Access"). Its project file is amlhpc/infra/access/Pulumi.yaml; config
(amlhpc/infra/access/config.py) names the GitHub repository, the region and the state account.
The environment stacks then deploy with only what the model gives their deploy identity.
"""
