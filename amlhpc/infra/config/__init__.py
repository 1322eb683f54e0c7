"""Stack configuration: parse `Pulumi.<stack>.yaml` once into a typed, validated object.

A stack's YAML is the single place a user edits. `load_stack_config()` reads it (offline
plan, tests, jobs) and `from_pulumi()` reads the same keys through `pulumi.Config` (under
the engine, so `pulumi config set` and `--config` work). Both end in `parse()`, which
collects every problem - types first, then the rules that need the SKU catalog - and
raises one `UserError` naming the file, the key, the bad value, what is allowed and the
command that fixes it. Nothing here imports Pulumi at module level: a bad config fails
before a single resource is registered.

The package, by concern:

- models.py: the keys' types (pydantic) and the validated StackConfig
- services.py: the types of the shared services' keys (controller cluster, registries)
- files.py: reading a stack file or the engine's config
- parse.py: parse() and the rules about the stack as a whole (kind, expiry, names, storage)
- clusters.py, network.py, hardening.py: the rules of each concern
- problems.py: how a problem names its key and its fix
"""

from amlhpc.infra.config.files import (
    available_stacks,
    from_pulumi,
    load_stack_config,
    read_stack_file,
    stack_file,
)
from amlhpc.infra.config.models import (
    DEFAULT_FQDN_RULES,
    EXPERIMENT_PREFIX,
    LOCATION_KEY,
    NAME_SUFFIX_KEY,
    NAMESPACE,
    PROJECT,
    REPO_ROOT,
    UNHELD_PUBLIC_KEY,
    BastionConfig,
    BudgetConfig,
    CiRunnersConfig,
    ClusterConfig,
    DiagnosticsConfig,
    EncryptionConfig,
    HandOffConfig,
    JumpBoxConfig,
    LocksConfig,
    ManagedNetworkSettings,
    NetworkConfig,
    OutboundMode,
    PrincipalConfig,
    SshConfig,
    StackConfig,
    StackKind,
    StorageConfig,
    WayInConfig,
    WayInSubnets,
    _RawConfig,
)
from amlhpc.infra.config.parse import check_experiment_against_environment, parse, parse_expires_at
from amlhpc.infra.config.problems import fix_command
from amlhpc.infra.config.services import (
    CONTROLLER_PRICE_REGION,
    CONTROLLER_SKU,
    CONTROLLER_USD_PER_HOUR,
    ContainerRegistryConfig,
    ControllerConfig,
    MlRegistryConfig,
)

__all__ = [
    "BastionConfig",
    "BudgetConfig",
    "CONTROLLER_PRICE_REGION",
    "CONTROLLER_SKU",
    "CONTROLLER_USD_PER_HOUR",
    "CiRunnersConfig",
    "ClusterConfig",
    "ContainerRegistryConfig",
    "ControllerConfig",
    "DEFAULT_FQDN_RULES",
    "DiagnosticsConfig",
    "EXPERIMENT_PREFIX",
    "EncryptionConfig",
    "HandOffConfig",
    "JumpBoxConfig",
    "LOCATION_KEY",
    "LocksConfig",
    "ManagedNetworkSettings",
    "MlRegistryConfig",
    "NAMESPACE",
    "NAME_SUFFIX_KEY",
    "NetworkConfig",
    "OutboundMode",
    "PROJECT",
    "PrincipalConfig",
    "REPO_ROOT",
    "SshConfig",
    "StackConfig",
    "StackKind",
    "StorageConfig",
    "UNHELD_PUBLIC_KEY",
    "WayInConfig",
    "WayInSubnets",
    "_RawConfig",
    "available_stacks",
    "check_experiment_against_environment",
    "fix_command",
    "from_pulumi",
    "load_stack_config",
    "parse",
    "parse_expires_at",
    "read_stack_file",
    "stack_file",
]
