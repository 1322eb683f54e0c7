"""Values sent in the casing the REST specification's enums use: Azure answers GETs in that
casing, so a value sent in another one reads back as a change after every import."""

from __future__ import annotations

from azure.ai.ml._restclient.arm_ml_service.models import SystemDatastoresAuthMode

from amlhpc.infra import quirks


def test_system_datastores_auth_mode_is_sent_as_the_spec_spells_it():
    """Microsoft.MachineLearningServices 2025-12-01, SystemDatastoresAuthMode: AccessKey,
    Identity, UserDelegationSAS (azure-ai-ml's generated enum of the same specification)."""
    allowed = {m.value for m in SystemDatastoresAuthMode}
    assert set(quirks.SYSTEM_DATASTORES_AUTH_MODE.values()) <= allowed, quirks.SYSTEM_DATASTORES_AUTH_MODE
