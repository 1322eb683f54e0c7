"""The Pulumi SDK surfaces the offline plan stands on, held to the versions pyproject.toml pins.

amlhpc/infra/plan runs the real program under Pulumi's mock runtime. It uses the SDK's public
testing API (`set_mocks`, `pulumi.runtime.test`, `Mocks`, `MockMonitor`), the fields of
Pulumi's resource protocol that the mock monitor receives, `pulumi.runtime.rpc`'s secret
helpers, `ResourceOptions.merge` and stack transformations, plus the file layout of the
generated azure-native package (amlhpc/infra/plan/lazy_provider.py). An SDK upgrade can change
any of them; each test here names the surface, the file that relies on it and the version
it was tested with, so the failure says what to look at.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pulumi
import pytest
from pulumi.runtime import mocks, rpc
from pulumi.runtime.proto import resource_pb2

from amlhpc.infra.config import REPO_ROOT
from amlhpc.infra.plan import lazy_provider, record

PINS = {
    re.split(r"[=<>~!]", spec, maxsplit=1)[0]: spec
    for spec in tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    if spec.startswith("pulumi")
}


def pinned(package: str) -> str:
    spec = PINS[package]
    assert spec.startswith(f"{package}=="), f"pyproject.toml pins {package} loosely ({spec}); pin it exactly"
    return spec.split("==", 1)[1]


def broken(surface: str, user: str, detail: str, package: str = "pulumi") -> str:
    installed = importlib.metadata.version(package)
    return (f"{package} {installed} changed {surface}, which {user} relies on (tested with "
            f"{package}=={pinned(package)}, pyproject.toml): {detail}")


@pytest.mark.parametrize("package", ["pulumi", "pulumi-azure-native"])
def test_installed_versions_are_the_pinned_ones(package):
    """The environment runs the SDK versions the plan was tested with."""
    installed = importlib.metadata.version(package)
    assert installed == pinned(package), (
        f"{package} {installed} is installed, but the offline plan is tested with {package}=={pinned(package)} "
        f"(pyproject.toml): run `uv sync --frozen`, or, to upgrade, move the pin, run `uv lock` and this file's tests")


def test_set_mocks_takes_our_monitor():
    """amlhpc/infra/plan/__init__.py passes a RecordingMonitor through set_mocks(monitor=...)."""
    params = inspect.signature(pulumi.runtime.set_mocks).parameters
    missing = {"mocks", "project", "stack", "preview", "monitor"} - set(params)
    assert not missing, broken("pulumi.runtime.set_mocks", "amlhpc/infra/plan/__init__.py", f"no parameter(s) {missing}")


def test_mock_monitor_methods():
    """amlhpc/infra/plan/mocks.py subclasses MockMonitor and overrides two of its gRPC methods."""
    for method in ("RegisterResource", "ReadResource"):
        assert callable(getattr(mocks.MockMonitor, method, None)), broken(
            f"pulumi.runtime.mocks.MockMonitor.{method}", "amlhpc/infra/plan/mocks.py", "method gone")
    assert list(inspect.signature(mocks.MockMonitor.__init__).parameters)[1:] == ["mocks"], broken(
        "MockMonitor.__init__", "amlhpc/infra/plan/mocks.py", "signature is no longer (mocks)")


@pytest.mark.parametrize(("message", "fields"), [
    ("RegisterResourceRequest", {"type", "name", "parent", "custom", "object", "protect", "retainOnDelete",
                                 "deleteBeforeReplace", "replaceOnChanges", "ignoreChanges", "dependencies"}),
    ("ReadResourceRequest", {"type", "name", "parent", "properties", "dependencies"}),
])
def test_resource_protocol_fields(message, fields):
    """The request fields RecordingMonitor records (the options the engine would see)."""
    descriptor = getattr(resource_pb2, message).DESCRIPTOR
    missing = fields - set(descriptor.fields_by_name)
    assert not missing, broken(f"pulumi's {message}", "amlhpc/infra/plan/mocks.py", f"field(s) {sorted(missing)} gone")


def test_rpc_secret_helpers():
    """Secret inputs are found with rpc.is_rpc_secret on deserialized properties."""
    for name in ("deserialize_properties", "is_rpc_secret"):
        assert callable(getattr(rpc, name, None)), broken(f"pulumi.runtime.rpc.{name}", "amlhpc/infra/plan/mocks.py", "gone")


def test_output_methods_the_plan_awaits():
    """The outputs document is resolved with Output.future() and Output.is_secret()."""
    for name in ("future", "is_secret"):
        assert inspect.iscoroutinefunction(getattr(pulumi.Output, name, None)), broken(
            f"pulumi.Output.{name}", "amlhpc/infra/plan/__init__.py", "no longer a coroutine method")


def test_secret_inputs_are_named_and_never_recorded():
    """A Pulumi secret input shows up in secretInputs with a placeholder, not its value."""

    def program():
        pulumi.CustomResource("test:index:Thing", "thing", {"password": pulumi.Output.secret("hunter2"),
                                                              "plain": "visible"})

    resources, _, _ = record(program)
    (thing,) = resources
    assert thing.secret_inputs == ["password"], broken("secret marking of inputs", "amlhpc/infra/plan/mocks.py",
                                                       f"secretInputs {thing.secret_inputs}")
    assert thing.inputs == {"password": "[secret]", "plain": "visible"}
    assert "hunter2" not in json.dumps(thing.to_json())


def test_options_reach_the_monitor():
    """protect, retainOnDelete, deleteBeforeReplace, replaceOnChanges, ignoreChanges and
    dependencies arrive as RecordingMonitor reads them."""

    def program():
        first = pulumi.CustomResource("test:index:Thing", "first", {})
        pulumi.CustomResource("test:index:Thing", "second", {"a": 1}, opts=pulumi.ResourceOptions(
            protect=True, retain_on_delete=True, delete_before_replace=True, replace_on_changes=["a"],
            ignore_changes=["b"], depends_on=[first]))

    resources, _, _ = record(program)
    second = next(r for r in resources if r.name == "second")
    got = (second.protect, second.retain_on_delete, second.delete_before_replace, second.replace_on_changes,
           second.ignore_changes, [u.rsplit("::", 1)[-1] for u in second.depends_on])
    assert got == (True, True, True, ["a"], ["b"], ["first"]), broken(
        "resource options under set_mocks", "amlhpc/infra/plan/mocks.py", f"recorded {got}")


def test_each_run_starts_clean():
    """pulumi.runtime.test on a fresh thread per evaluation: a failed run leaves nothing
    behind for the next (root stack resource, pending registrations)."""

    def failing():
        pulumi.CustomResource("test:index:Thing", "doomed", {})
        raise pulumi.RunError("boom")

    with pytest.raises(pulumi.RunError, match="boom"):
        record(failing)
    resources, outputs, _ = record(lambda: {"x": pulumi.CustomResource("test:index:Thing", "kept", {}).urn})
    assert [r.name for r in resources] == ["kept"], broken("pulumi.runtime.test / set_mocks state",
                                                          "amlhpc/infra/plan/__init__.py", f"saw {resources}")
    assert outputs["x"].endswith("$test:index:Thing::kept")


def test_a_run_leaves_no_event_loop_open():
    """Pulumi sends monitor calls to the loop's default executor, and its mock monitor gives
    each worker thread a loop of its own (`_sync_await`) that nothing closes:
    amlhpc/infra/plan/event_loop.py closes them with the run's, so the garbage collector finds
    none to warn about later."""
    import gc
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        record(lambda: {"x": pulumi.CustomResource("test:index:Thing", "one", {}).urn})
        gc.collect()
    unclosed = [str(w.message) for w in caught if "unclosed event loop" in str(w.message)]
    assert unclosed == [], broken("run_in_executor(None) / _sync_await's per-thread loops",
                                  "amlhpc/infra/plan/event_loop.py", f"{len(unclosed)} left open")


def test_stack_transformations_run_under_mocks():
    """The plan drops azure-native's API-version aliases with a stack transformation and
    ResourceOptions.merge (a copy); both must still work client-side under mocks."""
    from amlhpc.infra.plan import _drop_provider_version_aliases

    seen = []

    def program():
        # Runs after the plan's own transformation (registered first, by amlhpc.infra.plan._run).
        pulumi.runtime.register_stack_transformation(
            lambda args: seen.append([a.name or a.type_ for a in args.opts.aliases or []]))
        pulumi.CustomResource("azure-native:storage:StorageAccount", "acct", {}, opts=pulumi.ResourceOptions(
            aliases=[pulumi.Alias(type_="azure-native:storage/v20230101:StorageAccount"), pulumi.Alias(name="old")]))

    record(program)
    assert seen == [["old"]], broken("pulumi.runtime.register_stack_transformation", "amlhpc/infra/plan/__init__.py",
                                     f"aliases after the plan's transformation: {seen}")
    opts = pulumi.ResourceOptions(aliases=[pulumi.Alias(type_="azure-native:storage/v20230101:StorageAccount"),
                                           pulumi.Alias(name="old")])
    args = pulumi.ResourceTransformationArgs(None, "azure-native:storage:StorageAccount", "acct", {}, opts)
    result = _drop_provider_version_aliases(args)
    assert result is not None and [a.name for a in result.opts.aliases] == ["old"], broken(
        "pulumi.ResourceOptions.merge", "amlhpc/infra/plan/__init__.py", "the copy lost or kept the wrong aliases")
    assert len(opts.aliases) == 2, broken("pulumi.ResourceOptions.merge", "amlhpc/infra/plan/__init__.py",
                                          "merge changed its input")


def test_engine_detection():
    """amlhpc/infra/__main__.py tells the engine from the CLI with pulumi.runtime.settings.get_monitor()."""
    from pulumi.runtime import settings

    assert callable(getattr(settings, "get_monitor", None)), broken(
        "pulumi.runtime.settings.get_monitor", "amlhpc/infra/__main__.py", "gone")


# The service modules the program uses; each must load lazily to the stock package's objects.
SERVICES = ("applicationinsights", "authorization", "consumption", "containerregistry", "keyvault",
            "machinelearningservices", "managedidentity", "network", "operationalinsights", "privatedns",
            "resources", "storage")


def test_generated_layout_lazy_loading_relies_on():
    """azure-native's generated layout (one file per resource listing its names in
    `__all__`, plus `_inputs`, `_enums`, `outputs`): every public name of a stock service
    package is found where amlhpc/infra/plan/lazy_provider.py looks for it."""
    script = (
        "import importlib, json, types\n"
        "def api(n, v):  # public names, not the modules the generated __init__ imports for itself\n"
        "    if n.startswith('_'):\n"
        "        return False\n"
        "    return not isinstance(v, types.ModuleType) or v.__name__.startswith('pulumi_azure_native.')\n"
        "out = {}\n"
        f"for s in {list(SERVICES)!r}:\n"
        "    m = importlib.import_module('pulumi_azure_native.' + s)\n"
        "    m._utilities  # leaves pulumi's lazy module: the stock package runs\n"
        "    out[s] = sorted(n for n, v in vars(m).items() if api(n, v))\n"
        "print(json.dumps(out))\n")
    env = {**os.environ, lazy_provider.EAGER_ENV: "1"}
    stock = json.loads(subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                                      text=True, check=True, cwd=REPO_ROOT).stdout)
    package = Path(importlib.util.find_spec("pulumi_azure_native").submodule_search_locations[0])
    for service, names in stock.items():
        directory = package / service
        index = lazy_provider.index(directory)
        shared = {n for f in ("_inputs.py", "_enums.py") if (directory / f).is_file()
                  for n in lazy_provider.exported_names(directory / f)}
        modules = {p.stem for p in directory.glob("*.py")} | {p.name for p in directory.iterdir() if p.is_dir()}
        unknown = sorted(n for n in names if n not in index and n not in shared and n not in modules)
        assert not unknown, broken(f"the layout of pulumi_azure_native.{service}", "amlhpc/infra/plan/lazy_provider.py",
                                   f"names not where the lazy loader looks: {unknown[:10]}",
                                   package="pulumi-azure-native")
