"""`python -m amlhpc.images build` and friends with a fake command runner (no az, pulumi or
Docker here): skip present tags, build missing ones with the pins as build args from a
context that hashes to the tag, report every image, and give clear errors (exit 2) for
bad input, a missing az, or no login."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from amlhpc.core.errors import UserError
from amlhpc.images import catalog, cli, context
from amlhpc.images.build import AzError, AzureCli, build_images, git_commit
from amlhpc.images.commands import CommandNotFound, CommandResult
from amlhpc.images.stack import registry_name, resolve_login_server

ROOT = Path(__file__).resolve().parent.parent
DEV_OUTPUTS = ROOT / "tests" / "fixtures" / "outputs" / "dev.json"
LOGIN = "amlhpcdevacr4abd2.azurecr.io"


class FakeRunner:
    """Answers like az / pulumi / git would; records every argv (and what each build uploads)."""

    def __init__(self, *, present: dict[str, list[str]] | None = None, missing_repos: bool = True,
                 build_codes: dict[str, int] | None = None, installed: tuple[str, ...] = ("az", "git", "pulumi", "docker"),
                 logged_in: bool = True, pulumi_outputs: dict | None = None, pulumi_error: str = "",
                 tags_error: str = ""):
        self.present = present or {}
        self.missing_repos = missing_repos
        self.build_codes = build_codes or {}
        self.installed = installed
        self.logged_in = logged_in
        self.pulumi_outputs = pulumi_outputs
        self.pulumi_error = pulumi_error
        self.tags_error = tags_error
        self.calls: list[list[str]] = []
        self.uploads: dict[str, dict[str, context.ContextFile]] = {}

    def __call__(self, argv, *, capture=True, cwd=None):
        self.calls.append(list(argv))
        if argv[0] not in self.installed:
            raise CommandNotFound(argv[0])
        if argv[:2] == ["az", "version"]:
            return CommandResult(0, '{"azure-cli": "2.80.0"}')
        if argv[:3] == ["az", "account", "show"]:
            return CommandResult(0, "research-sub\n") if self.logged_in else CommandResult(
                1, "", "ERROR: Please run 'az login' to setup account.")
        if argv[:4] == ["az", "acr", "repository", "show-tags"]:
            repo = argv[argv.index("--repository") + 1]
            if self.tags_error:
                return CommandResult(1, "", self.tags_error)
            if repo in self.present:
                return CommandResult(0, json.dumps(self.present[repo]))
            return CommandResult(1, "", f"ERROR: repository {repo} is not found.") if self.missing_repos else CommandResult(0, "[]")
        if argv[:3] == ["az", "acr", "build"]:
            image = argv[argv.index("--image") + 1]
            staged = Path(argv[-1])
            self.uploads[image] = context.read_staged(staged)
            return CommandResult(self.build_codes.get(image.split(":")[0], 0))
        if argv[:3] == ["pulumi", "stack", "output"]:
            if self.pulumi_error:
                return CommandResult(255, "", self.pulumi_error)
            return CommandResult(0, json.dumps(self.pulumi_outputs or {}))
        if argv[0] == "git":
            if "rev-parse" in argv:
                return CommandResult(0, "0123abcd" * 5 + "\n")
            return CommandResult(0, "")
        if argv[:2] == ["docker", "run"]:
            return CommandResult(0)
        raise AssertionError(f"unexpected command {argv}")

    def builds(self) -> list[list[str]]:
        return [c for c in self.calls if c[:3] == ["az", "acr", "build"]]


@pytest.fixture
def releases():
    return catalog.releases()


def build_args_of(argv: list[str]) -> dict[str, str]:
    return dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--build-arg")


class TestBuildImages:
    def test_skips_present_tags_and_builds_missing_ones(self, releases):
        pytorch, tensorflow = releases[0], releases[-1]
        runner = FakeRunner(present={"aml-hpc/pytorch": ["old", pytorch.tag], "aml-hpc/pytorch-arm64": [releases[1].tag],
                                     "aml-hpc/rocm": [releases[2].tag]})
        outcomes = build_images(releases, login_server=LOGIN, az=AzureCli(runner), commit="c0ffee", echo=lambda _: None)
        assert [o.action for o in outcomes] == ["present", "present", "present", "built"]
        assert [o.ref for o in outcomes] == [r.ref(LOGIN) for r in releases]
        (argv,) = runner.builds()
        assert argv[argv.index("--registry") + 1] == "amlhpcdevacr4abd2"
        assert argv[argv.index("--image") + 1] == f"aml-hpc/tensorflow:{tensorflow.tag}"
        assert argv[argv.index("--file") + 1] == "Dockerfile"
        assert argv[argv.index("--platform") + 1] == "linux/amd64"

    def test_pins_and_labels_are_passed_as_build_args(self, releases):
        runner = FakeRunner()
        build_images(releases[:1], login_server=LOGIN, az=AzureCli(runner), commit="c0ffee", echo=lambda _: None)
        args = build_args_of(runner.builds()[0])
        assert args == {**releases[0].build_args, "GIT_COMMIT": "c0ffee", "IMAGE_VERSION": releases[0].tag}
        assert args["BASE_IMAGE"].startswith("nvcr.io/nvidia/pytorch:") and "@sha256:" in args["BASE_IMAGE"]

    def test_uploaded_context_is_what_the_tag_promises(self, releases):
        runner = FakeRunner()
        build_images(releases, login_server=LOGIN, az=AzureCli(runner), commit="x", echo=lambda _: None)
        for release in releases:
            uploaded = runner.uploads[f"{release.spec.repository}:{release.tag}"]
            assert context.content_hash(uploaded, dict(release.build_args)) == release.tag
            assert "Dockerfile" in uploaded and "aml-hpc/python/amlhpc/jobs/runtime/base/contract.py" in uploaded
            assert not any(name.startswith((".venv", "node_modules", "amlhpc/infra/")) for name in uploaded)

    def test_staging_folder_is_removed_afterwards(self, releases, tmp_path):
        runner = FakeRunner()
        build_images(releases[:1], login_server=LOGIN, az=AzureCli(runner), commit="x", workdir=tmp_path, echo=lambda _: None)
        assert list(tmp_path.iterdir()) == []

    def test_an_empty_repository_is_not_an_error(self, releases):
        runner = FakeRunner(missing_repos=False)
        outcomes = build_images(releases, login_server=LOGIN, az=AzureCli(runner), commit="x", echo=lambda _: None)
        assert [o.action for o in outcomes] == ["built"] * len(releases)

    def test_dry_run_builds_nothing(self, releases):
        runner = FakeRunner()
        outcomes = build_images(releases, login_server=LOGIN, az=AzureCli(runner), commit="x", dry_run=True, echo=lambda _: None)
        assert [o.action for o in outcomes] == ["would-build"] * len(releases) and runner.builds() == []

    def test_one_failure_does_not_stop_the_others(self, releases):
        runner = FakeRunner(build_codes={"aml-hpc/pytorch": 1})
        outcomes = build_images(releases, login_server=LOGIN, az=AzureCli(runner), commit="x", echo=lambda _: None)
        assert [o.action for o in outcomes] == ["failed"] + ["built"] * (len(releases) - 1)
        assert "exited 1" in outcomes[0].detail

    def test_other_show_tags_errors_surface(self, releases):
        runner = FakeRunner(tags_error="ERROR: (AuthorizationFailed) no permission")
        with pytest.raises(AzError, match="AuthorizationFailed"):
            build_images(releases, login_server=LOGIN, az=AzureCli(runner), commit="x", echo=lambda _: None)

    def test_agent_pool_and_timeout_pass_through(self, releases):
        runner = FakeRunner()
        build_images(releases[:1], login_server=LOGIN, az=AzureCli(runner), commit="x", agent_pool="gpu-builders",
                     timeout_s=9000, echo=lambda _: None)
        argv = runner.builds()[0]
        assert argv[argv.index("--agent-pool") + 1] == "gpu-builders" and argv[argv.index("--timeout") + 1] == "9000"


class TestAzReadiness:
    def test_missing_az(self):
        with pytest.raises(UserError, match="Azure CLI .az. is not installed") as caught:
            AzureCli(FakeRunner(installed=())).check_ready()
        assert "install-azure-cli" in caught.value.render()

    def test_not_logged_in(self):
        with pytest.raises(UserError, match="not logged in") as caught:
            AzureCli(FakeRunner(logged_in=False)).check_ready()
        assert "az login" in caught.value.render()

    def test_ready(self):
        assert AzureCli(FakeRunner()).check_ready() == "research-sub"


class TestGitCommit:
    def test_clean_and_dirty(self):
        clean = FakeRunner()
        assert git_commit(clean, ROOT) == "0123abcd" * 5

        class Dirty(FakeRunner):
            def __call__(self, argv, **kw):
                if "status" in argv:
                    return CommandResult(0, " M amlhpc/jobs/runtime/launch/launcher.py\n")
                return super().__call__(argv, **kw)

        assert git_commit(Dirty(), ROOT).endswith("-dirty")

    def test_no_git(self):
        assert git_commit(FakeRunner(installed=("az",)), ROOT) == "unknown"


@pytest.fixture
def pulumi_on_path(monkeypatch):
    """amlhpc.jobs.plan.outputs looks for the pulumi binary itself before running it."""
    import amlhpc.jobs.plan.outputs

    monkeypatch.setattr(amlhpc.jobs.plan.outputs.shutil, "which", lambda name: f"/usr/bin/{name}")


class TestLoginServer:
    def test_from_an_outputs_file(self):
        assert resolve_login_server(stack="dev", runner=FakeRunner(), outputs_file=DEV_OUTPUTS) == LOGIN

    def test_explicit_flag_wins(self):
        runner = FakeRunner()
        assert resolve_login_server(stack="dev", runner=runner, login_server="Other.azurecr.io",
                                    outputs_file=DEV_OUTPUTS) == "other.azurecr.io"
        assert runner.calls == []

    def test_from_the_deployed_stack(self, pulumi_on_path):
        runner = FakeRunner(pulumi_outputs=json.loads(DEV_OUTPUTS.read_text()))
        assert resolve_login_server(stack="dev", runner=runner) == LOGIN
        assert runner.calls == [["pulumi", "stack", "output", "--json", "--stack", "dev"]]

    def test_registry_name(self):
        assert registry_name(LOGIN) == "amlhpcdevacr4abd2"

    @pytest.mark.parametrize(("kwargs", "expected"), [
        ({"login_server": "https://myacr.azurecr.io/x"}, "is not a registry host name"),
        ({"outputs_file": Path("/nonexistent/outputs.json")}, "outputs file not found"),
    ])
    def test_bad_input(self, kwargs, expected):
        with pytest.raises(UserError, match=expected):
            resolve_login_server(stack="dev", runner=FakeRunner(), **kwargs)

    def test_outputs_of_another_stack_are_refused(self):
        """Building prod's images into dev's registry (or back) is the mistake to stop."""
        with pytest.raises(UserError, match="for stack 'dev', not 'prod'"):
            resolve_login_server(stack="prod", runner=FakeRunner(), outputs_file=DEV_OUTPUTS)

    def test_outputs_without_login_server(self, tmp_path):
        doc = json.loads(DEV_OUTPUTS.read_text())
        del doc["registry"]["loginServer"]
        path = tmp_path / "out.json"
        path.write_text(json.dumps(doc))
        with pytest.raises(UserError) as caught:
            resolve_login_server(stack="dev", runner=FakeRunner(), outputs_file=path)
        text = caught.value.render()
        assert "registry.loginServer: stack outputs are missing this key" in text and str(path) in text

    def test_bad_login_server_in_outputs(self, tmp_path):
        doc = json.loads(DEV_OUTPUTS.read_text())
        doc["registry"]["loginServer"] = "https://acr.azurecr.io/"
        path = tmp_path / "out.json"
        path.write_text(json.dumps(doc))
        with pytest.raises(UserError, match="registry.loginServer: 'https://acr.azurecr.io/' is not a registry host"):
            resolve_login_server(stack="dev", runner=FakeRunner(), outputs_file=path)

    def test_outputs_not_json(self, tmp_path):
        path = tmp_path / "out.json"
        path.write_text("{not json")
        with pytest.raises(UserError, match="not valid JSON"):
            resolve_login_server(stack="dev", runner=FakeRunner(), outputs_file=path)

    def test_no_pulumi_cli(self, monkeypatch):
        import amlhpc.jobs.plan.outputs

        monkeypatch.setattr(amlhpc.jobs.plan.outputs.shutil, "which", lambda name: None)
        with pytest.raises(UserError) as caught:
            resolve_login_server(stack="dev", runner=FakeRunner())
        assert "pulumi command is not installed" in caught.value.render() and "--outputs FILE" in caught.value.render()

    def test_unknown_stack(self, pulumi_on_path):
        runner = FakeRunner(pulumi_error="error: no stack named 'qa' found")
        with pytest.raises(UserError, match="no stack named 'qa'"):
            resolve_login_server(stack="qa", runner=runner)

    def test_undeployed_stack(self, pulumi_on_path):
        with pytest.raises(UserError, match="stack outputs are missing this key"):
            resolve_login_server(stack="dev", runner=FakeRunner(pulumi_outputs={}))


@pytest.fixture
def invoke(monkeypatch):
    """Run `python -m amlhpc.images ...` in-process with a given fake runner."""

    def run(args: list[str], runner: FakeRunner | None = None):
        fake = runner or FakeRunner()
        monkeypatch.setattr(cli, "runner_factory", lambda: fake)
        return CliRunner().invoke(cli.app, args), fake

    return run


class TestCli:
    def test_build_prints_every_reference(self, invoke):
        result, runner = invoke(["build", "--stack", "dev", "--outputs", str(DEV_OUTPUTS)])
        assert result.exit_code == 0, result.output
        for release in catalog.releases(specs=catalog.ALL_IMAGES):  # the controller's image too
            assert f"{release.spec.name}={release.ref(LOGIN)}" in result.stdout
        assert len(runner.builds()) == len(catalog.ALL_IMAGES) == 5

    def test_each_image_is_built_for_its_own_platform(self, invoke, releases):
        """The arm64 (Grace) image is built for linux/arm64, the others for linux/amd64."""
        result, runner = invoke(["build", "--stack", "dev", "--login-server", LOGIN])
        assert result.exit_code == 0, result.output
        platforms = {c[c.index("--image") + 1].split(":")[0]: c[c.index("--platform") + 1] for c in runner.builds()}
        assert platforms == {"aml-hpc/pytorch": "linux/amd64", "aml-hpc/pytorch-arm64": "linux/arm64",
                             "aml-hpc/rocm": "linux/amd64", "aml-hpc/tensorflow": "linux/amd64",
                             "aml-hpc/controller": "linux/amd64"}

    def test_build_selected_image_only(self, invoke):
        result, runner = invoke(["build", "--stack", "dev", "--login-server", LOGIN, "--image", "tensorflow"])
        assert result.exit_code == 0, result.output
        assert [c[c.index("--image") + 1].split(":")[0] for c in runner.builds()] == ["aml-hpc/tensorflow"]

    def test_failed_build_exits_1_after_reporting_all(self, invoke):
        result, _ = invoke(["build", "--stack", "dev", "--login-server", LOGIN],
                           FakeRunner(build_codes={"aml-hpc/tensorflow": 2}))
        assert result.exit_code == 1 and "aml-hpc-pytorch=" in result.stdout and "aml-hpc-tensorflow=" in result.stdout

    @pytest.mark.parametrize(("args", "runner", "message"), [
        (["--image", "jax"], FakeRunner(), "unknown image 'jax'"),
        ([], FakeRunner(installed=("git",)), "Azure CLI (az) is not installed"),
        ([], FakeRunner(logged_in=False), "az login"),
        (["--platform", "windows/amd64"], FakeRunner(), "is not a Linux platform"),
    ])
    def test_bad_input_exits_2_and_builds_nothing(self, invoke, args, runner, message):
        result, fake = invoke(["build", "--stack", "dev", "--login-server", LOGIN, *args], runner)
        assert result.exit_code == 2 and message in result.stderr
        assert fake.builds() == []

    def test_wrong_stack_outputs_exit_2_before_any_az_call(self, invoke):
        result, fake = invoke(["build", "--stack", "prod", "--outputs", str(DEV_OUTPUTS)])
        assert result.exit_code == 2 and "not 'prod'" in result.stderr
        assert not any(c[0] == "az" for c in fake.calls)

    def test_az_failure_exits_1(self, invoke):
        result, _ = invoke(["build", "--stack", "dev", "--login-server", LOGIN], FakeRunner(tags_error="ERROR: network down"))
        assert result.exit_code == 1 and "network down" in result.stderr

    def test_dry_run(self, invoke):
        result, fake = invoke(["build", "--stack", "dev", "--login-server", LOGIN, "--dry-run"])
        assert result.exit_code == 0 and "would build" in result.stderr and fake.builds() == []

    def test_list_json(self, invoke):
        releases = catalog.releases(specs=catalog.ALL_IMAGES)
        result, _ = invoke(["list", "--json", "--login-server", LOGIN])
        rows = json.loads(result.stdout)
        assert [r["tag"] for r in rows] == [r.tag for r in releases]
        assert rows[0]["ref"] == releases[0].ref(LOGIN) and rows[0]["environment"] == releases[0].environment_id

    def test_check_passes_on_the_repository(self, invoke):
        result, _ = invoke(["check"])
        assert result.exit_code == 0, result.output

    def test_context_stages_and_prints_the_docker_command(self, invoke, tmp_path, releases):
        result, _ = invoke(["context", "aml-hpc-pytorch", "--out", str(tmp_path / "ctx")])
        assert result.exit_code == 0, result.output
        assert (tmp_path / "ctx" / "Dockerfile").is_file()
        assert f"-t aml-hpc/pytorch:{releases[0].tag}" in result.stdout and "--build-arg DEEPSPEED_VERSION=" in result.stdout

    def test_context_refuses_a_used_folder(self, invoke, tmp_path):
        (tmp_path / "keep.txt").write_text("mine")
        result, _ = invoke(["context", "aml-hpc-pytorch", "--out", str(tmp_path)])
        assert result.exit_code == 2 and "is not empty" in result.stderr and (tmp_path / "keep.txt").read_text() == "mine"

    def test_smoke_runs_the_image_with_gpus(self, invoke):
        result, fake = invoke(["smoke", f"{LOGIN}/aml-hpc/pytorch:0123456789ab", "--expect-ib"])
        assert result.exit_code == 0
        (argv,) = [c for c in fake.calls if c[0] == "docker"]
        assert argv[:4] == ["docker", "run", "--rm", "--gpus"] and argv[-3:] == ["aml-hpc-smoke", "--expect-gpu", "--expect-ib"]

    def test_smoke_without_docker(self, invoke):
        result, _ = invoke(["smoke", "x.azurecr.io/a:b"], FakeRunner(installed=("az",)))
        assert result.exit_code == 2 and "Docker is not installed" in result.stderr


def test_pulumi_and_cli_agree_on_tags(tmp_path):
    """The Pulumi program registers catalog.releases(); the build uses catalog.release():
    same checkout, same tags - the environment always points at what the build pushes."""
    shutil.copytree(ROOT / "amlhpc" / "images", tmp_path / "amlhpc" / "images", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "amlhpc" / "jobs" / "runtime", tmp_path / "amlhpc" / "jobs" / "runtime", ignore=shutil.ignore_patterns("__pycache__"))
    from amlhpc.images.pins import load_pins

    pins = load_pins(tmp_path / "amlhpc" / "images" / "pins.toml")
    assert [r.tag for r in catalog.releases(tmp_path)] == [catalog.release(s, pins, tmp_path).tag for s in catalog.IMAGES]
