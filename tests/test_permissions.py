"""The permission model (amlhpc/core/catalog/permissions.toml, amlhpc/core/permissions.py): it loads and
refuses malformed entries by name, its built-in roles are Azure's, its conditions are in
Azure's syntax, nothing a cluster runs as can do more than a submitter, and docs/deploying.md's
tables are generated from it."""

from __future__ import annotations

import copy
import re
import tomllib

import pytest

from amlhpc.core import permissions, permissions_table
from amlhpc.core.permissions import MODEL, action_matches
from amlhpc.core.skus import CatalogError

# Azure's built-in role GUIDs, copied independently from Azure built-in roles
# (learn.microsoft.com/azure/role-based-access-control/built-in-roles, read 2026-11-26).
AZURE_GUIDS = {
    "Reader": "acdd72a7-3385-48ef-bd42-f606fba81ae7",
    "Contributor": "b24988ac-6180-42a0-ab88-20f7382dd24c",
    "Owner": "8e3af657-a8ff-443c-a75c-2fe8c4bcb635",
    "User Access Administrator": "18d7d88d-d35e-4fb5-a5c3-7773c20a72d9",
    "Role Based Access Control Administrator": "f58310d9-a9f6-439a-9e8d-f62e7b41a168",
    "Storage Blob Data Reader": "2a2b9908-6ea1-4ae2-8e65-a410df84e7d1",
    "Storage Blob Data Contributor": "ba92f5b4-2d11-453d-a403-e96b0029c9fe",
    "Storage File Data Privileged Contributor": "69566ab7-960f-475b-8e7c-b3118f30c6bd",
    "AcrPull": "7f951dda-4ed3-4680-a7ca-43fe172d538d",
    "Key Vault Crypto Service Encryption User": "e147488a-f6f5-4113-8e2d-b22465e65bf6",
    "AzureML Data Scientist": "f6c7c914-8db3-469d-8ca1-694a8f32e121",
    "Azure AI Administrator": "b78c5d69-af96-48a3-bf8d-a8b4d589de94",
    "Virtual Machine User Login": "fb879df8-f326-4884-b1cf-06f3ad86be52",
}


def document() -> dict:
    return tomllib.loads(permissions.PERMISSIONS_FILE.read_text())


class TestModel:
    def test_built_in_roles_are_azures(self):
        built_in = {r.name: r.guid for r in MODEL.roles.values() if not r.custom}
        assert built_in == AZURE_GUIDS

    def test_every_custom_action_says_which_call_needs_it(self):
        for role in MODEL.custom_roles():
            assert role.actions and all(len(role.why[a]) > 20 for a in role.actions), role.key

    def test_custom_role_guids_are_per_subscription_and_stable(self):
        role = MODEL.role("controller")
        assert role.guid_in("sub-a") == role.guid_in("SUB-A") != role.guid_in("sub-b")
        assert re.fullmatch(r"[0-9a-f-]{36}", role.guid_in("sub-a"))

    def test_the_teardown_identity_never_reaches_the_environments_state_or_passphrase(self):
        """teardown-<env> runs without reviewers: no right on the environment stack's state
        container, and no secret read from the environment's own passphrase file."""
        assert {r.scope for r in MODEL.rights_of("teardown")} == {"resource-group", "experiments-state-container"}
        teardown, deploy = MODEL.github_environment_of("teardown"), MODEL.github_environment_of("deploy")
        assert teardown is not None and deploy is not None
        assert teardown.secret_files("prod") == {"PULUMI_CONFIG_PASSPHRASE": "prod-experiments.txt"}
        assert deploy.secret_files("prod") == {"PULUMI_CONFIG_PASSPHRASE": "prod.txt",
                                               "PULUMI_EXPERIMENTS_PASSPHRASE": "prod-experiments.txt"}

    def test_privileged_roles_never_granted_without_a_condition(self):
        for right in MODEL.rights:
            if right.role.privileged:
                assert right.condition == "constrain-roles", right.key
        assert {r.role.key for r in MODEL.rights} & {"owner", "user-access-administrator"} == set()

    @pytest.mark.parametrize("mutate, fragment", [
        (lambda d: d["rights"][0].update(scope="somewhere"), "unknown scope 'somewhere'"),
        (lambda d: d["rights"][0].update(role="owner"), "Owner only with a condition"),
        (lambda d: d["rights"][0].update(principal="nobody"), "unknown principal 'nobody'"),
        (lambda d: d["rights"][0].update(why=""), "a right says why"),
        (lambda d: d["rights"][0].update(granted_by="hand"), "granted_by must be one of"),
        (lambda d: d["rights"].append(dict(d["rights"][0])), "is listed twice"),
        (lambda d: d["roles"]["controller"].update(guid="00000000-0000-0000-0000-000000000000"), "no guid"),
        (lambda d: d["roles"]["reader"].pop("source"), "needs its guid and source"),
        (lambda d: d["principals"]["compute"].update(colour="blue"), "unknown key(s) colour"),
        (lambda d: d["github_environments"]["teardown"].update(secrets=["PULUMI_CONFIG_PASSPHRASE"]),
         "github_environments.teardown.secrets: not a table of SECRET ="),
    ])
    def test_malformed_entries_are_refused_by_name(self, mutate, fragment):
        doc = copy.deepcopy(document())
        mutate(doc)
        with pytest.raises(CatalogError, match=re.escape(fragment)):
            permissions.parse(doc)


class TestMatching:
    @pytest.mark.parametrize("pattern, action, expected", [
        ("*", "Microsoft.Storage/storageAccounts/delete", True),
        ("*/read", "Microsoft.Storage/storageAccounts/read", True),
        ("*/read", "Microsoft.Storage/storageAccounts/write", False),
        ("Microsoft.Authorization/*/Write", "Microsoft.Authorization/roleAssignments/write", True),  # any case
        ("Microsoft.MachineLearningServices/workspaces/*/read", "Microsoft.MachineLearningServices/workspaces/read", False),
        ("Microsoft.MachineLearningServices/workspaces/*/read",
         "Microsoft.MachineLearningServices/workspaces/codes/versions/read", True),
    ])
    def test_azure_action_patterns(self, pattern, action, expected):
        assert action_matches(pattern, action) is expected

    def test_contributor_cannot_assign_roles(self):
        contributor = MODEL.role("contributor")
        assert contributor.allows("Microsoft.MachineLearningServices/workspaces/computes/write")
        assert not contributor.allows("Microsoft.Authorization/roleAssignments/write")


class TestConstrainRolesCondition:
    def test_has_azures_documented_shape(self):
        """Microsoft Learn, "Delegate Azure role assignment management to others with conditions",
        example "Constrain roles and principal types": writes checked on the request, deletes on
        the resource, each role with the principal types it may be given to."""
        condition = MODEL.constrain_roles_condition("sub")
        guid = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
        guids = rf"\{{{guid}(, {guid})*\}}"
        types = r"\{'[A-Za-z]+'(, '[A-Za-z]+')*\}"

        def allowed(source: str) -> str:
            one = (rf"\(@{source}\[Microsoft\.Authorization/roleAssignments:RoleDefinitionId\] ForAnyOfAnyValues:GuidEquals {guids}"
                   rf" AND @{source}\[Microsoft\.Authorization/roleAssignments:PrincipalType\] "
                   rf"ForAnyOfAnyValues:StringEqualsIgnoreCase {types}\)")
            return rf"\({one}( OR {one})*\)"

        shape = (r"\(\(!\(ActionMatches\{'Microsoft\.Authorization/roleAssignments/write'\}\)\) OR "
                 rf"{allowed('Request')}\)"
                 r" AND "
                 r"\(\(!\(ActionMatches\{'Microsoft\.Authorization/roleAssignments/delete'\}\)\) OR "
                 rf"{allowed('Resource')}\)")
        assert re.fullmatch(shape, condition), condition

    def test_roles_only_identities_hold_go_to_service_principals_only(self):
        groups = MODEL.assignable_principal_types()
        assert groups[("ServicePrincipal",)] == ["acr-pull", "azure-ai-administrator", "controller",
                                                 "key-vault-crypto-service-encryption-user"]
        assert "submitter" in groups[("Group", "ServicePrincipal", "User")]

    def test_lists_exactly_what_the_program_and_azure_ml_assign(self):
        listed = set(re.findall(r"[0-9a-f]{8}-[0-9a-f-]{27}", MODEL.constrain_roles_condition("sub")))
        assert listed == {r.role.guid_in("sub") for r in MODEL.rights if r.granted_by in ("program", "azure-ml")}
        assert AZURE_GUIDS["Owner"] not in listed and AZURE_GUIDS["User Access Administrator"] not in listed
        assert AZURE_GUIDS["Role Based Access Control Administrator"] not in listed


def covered(right, others) -> bool:
    """Whether every action of `right`'s role is allowed by some right of `others` at the same scope."""
    same_scope = [o.role for o in others if o.scope == right.scope]
    return (all(any(o.allows(a) for o in same_scope) for a in right.role.actions)
            and all(any(o.allows(a, data=True) for o in same_scope) for a in right.role.data_actions))


class TestNoEscalationThroughAJob:
    """Anyone who may submit can run a job on any cluster of the workspace, the controller's
    included (Azure ML has no per-cluster submit right and no RBAC condition on Azure ML
    actions), and that job acts as the cluster's identity. So the controller's identity may
    hold nothing a submitter cannot already do, in person or through a job on a GPU cluster."""

    def test_the_controller_holds_nothing_a_submitter_lacks(self):
        submitter = MODEL.rights_of("submitter") + MODEL.rights_of("compute")
        beyond = [r.key for r in MODEL.rights_of("controller") if not covered(r, submitter)]
        assert beyond == []

    def test_azureml_data_scientist_would_have_been_more(self):
        """What the controller held before: it reads datastore and connection secrets, which no
        submitter's job needs from it."""
        scientist = MODEL.role("azureml-data-scientist")
        controller = MODEL.role("controller")
        for action in ("Microsoft.MachineLearningServices/workspaces/datastores/listsecrets/action",
                       "Microsoft.MachineLearningServices/workspaces/connections/listsecrets/action",
                       "Microsoft.MachineLearningServices/workspaces/jobs/delete"):
            assert scientist.allows(action) and not controller.allows(action), action

    @pytest.mark.parametrize("action", [
        "Microsoft.MachineLearningServices/workspaces/outboundRules/write",
        "Microsoft.MachineLearningServices/workspaces/managedNetworks/outboundRules/write",
        "Microsoft.MachineLearningServices/workspaces/managedNetworks/write",
        "Microsoft.MachineLearningServices/workspaces/provisionManagedNetwork/action",
        "Microsoft.MachineLearningServices/workspaces/connections/write",
        "Microsoft.MachineLearningServices/workspaces/datastores/write",
    ])
    def test_no_submitter_opens_a_way_out_of_the_workspace(self, action):
        """AzureML Data Scientist let every submitter add an outbound rule, a connection or a
        datastore outside Pulumi and the policy pack; the submitter role does not."""
        assert MODEL.role("azureml-data-scientist").allows(action), action
        holders = [r.key for r in MODEL.rights if r.role.allows(action) and r.granted_by == "program"]
        assert holders == [], f"{action}: {holders}"
        assert MODEL.role("submitter").allows("Microsoft.MachineLearningServices/workspaces/jobs/write")

    def test_jobs_cannot_write_what_steers_the_controller(self):
        """The supervision container: the controller and the submitters write it, the GPU
        clusters' identity has no right on it at all."""
        assert [r.scope for r in MODEL.rights_of("compute") if r.scope == "container:supervision"] == []
        writers = {r.principal for r in MODEL.rights if r.scope == "container:supervision"
                   and r.role.allows("Microsoft.Storage/storageAccounts/blobServices/containers/blobs/write", data=True)}
        assert writers == {"controller", "submitter"}


class TestDocs:
    def test_deploying_md_holds_the_generated_tables(self):
        assert permissions_table.current() == permissions_table.tables(), (
            "docs/deploying.md is not current: run .venv/bin/python -m amlhpc.core.permissions_table --write")

    def test_every_right_and_principal_is_in_the_tables(self):
        text = permissions_table.tables()
        for principal in MODEL.principals.values():
            assert principal.title in text
        for right in MODEL.rights:
            assert right.why.replace("|", "\\|") in text
