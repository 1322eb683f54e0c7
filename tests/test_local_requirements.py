"""What a rehearsal needs is checked before anything starts, all at once, in a second or two;
old rehearsal folders are pruned, the current one never."""

from __future__ import annotations

import os
import socket
import time

import pytest

from amlhpc.core.errors import UserError
from amlhpc.jobs import recipes
from amlhpc.jobs.local import folders, requirements


def machine(modules=(), gpu=False, down=()):
    return requirements.Machine(module_available=lambda name: name in modules, has_gpu=lambda: gpu,
                                reachable=lambda endpoints, deadline: {e: ("refused" if e in down else None) for e in endpoints})


def with_azurite_env():
    return {"AMLHPC_BLOB_CONNECTION_STRING": "DefaultEndpointsProtocol=http;AccountName=a;AccountKey=k;BlobEndpoint=http://x/a"}


def test_everything_missing_is_named_at_once():
    recipe = recipes.load("maskrcnn", recipes.parse_overrides(["local.requires.modules=[torch, apex]"]))
    with pytest.raises(UserError) as info:
        requirements.check(recipe, env=with_azurite_env(), machine=machine(modules={"torch"}, down={"github.com:443"}))
    paths = [p.path for p in info.value.problems]
    assert paths == ["local.requires.gpu", "local.requires.modules", "inputs.coco.mode", "local.requires.network"]
    text = info.value.render()
    assert "apex" in text and "torch," not in text
    assert "submit it to a GPU cluster" in text, "the recipe's own hint replaces the generic fix"


def test_a_machine_with_everything_passes():
    recipe = recipes.load("cosmoflow", local=True)
    requirements.check(recipe, env=with_azurite_env(), machine=machine(modules={"torch", "numpy"}))


def test_modules_are_found_without_importing_them():
    assert requirements.module_available("json") and not requirements.module_available("no_such_module_xyz")
    assert not requirements.module_available("no_such_parent.child")


def test_unreachable_endpoints_are_bounded_by_the_deadline():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    started = time.monotonic()
    answers = requirements.reachable([f"127.0.0.1:{closed}", "no-such-host.invalid:443"], deadline_s=0.5)
    assert time.monotonic() - started < 1.5
    assert all(answers.values()), answers


@pytest.fixture
def no_azurite(monkeypatch, tmp_path):
    """A project without node_modules, a clone without Azurite, and a PATH without it."""
    from amlhpc.jobs.local import azurite

    monkeypatch.setattr(azurite, "AZURITE_BIN", tmp_path / "clone" / "node_modules" / ".bin" / "azurite-blob")
    monkeypatch.setenv("AMLHPC_PROJECT", str(tmp_path / "project"))
    return {"PATH": str(tmp_path / "bin")}


def _executable(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_azurite_is_required_unless_a_connection_string_is_given(no_azurite):
    problems = requirements.azurite_problems(no_azurite)
    assert problems and "make bootstrap" in problems[0].hint  # this test runs from a clone
    assert requirements.azurite_problems({**no_azurite, **with_azurite_env()}) == []


def test_an_install_is_told_the_npm_command_that_puts_azurite_on_path(no_azurite, monkeypatch):
    from amlhpc.core import invocation

    monkeypatch.setattr(invocation, "from_clone", lambda: False)
    (problem,) = [p for p in requirements.azurite_problems(no_azurite) if p.reference.startswith("Azurite")]
    assert "npm install --global azurite" in problem.hint and "on PATH" in problem.hint
    assert "make" not in problem.hint and ".venv" not in problem.hint


def test_azurite_is_found_on_path_or_in_the_project(no_azurite, tmp_path):
    from amlhpc.jobs.local import azurite

    assert azurite.find(no_azurite["PATH"]) is None
    on_path = _executable(tmp_path / "bin" / "azurite-blob")
    assert azurite.find(no_azurite["PATH"]) == on_path
    assert requirements.azurite_problems(no_azurite) == [] or all("Node.js" in p.reference for p in requirements.azurite_problems(no_azurite))
    in_project = _executable(tmp_path / "project" / "node_modules" / ".bin" / "azurite-blob")
    assert azurite.find(no_azurite["PATH"]) == in_project  # the project's own wins over PATH
    pinned = _executable(azurite.AZURITE_BIN)
    assert azurite.find(no_azurite["PATH"]) == pinned  # and the clone's pinned one over both


def test_the_torch_fix_names_the_cpu_build(monkeypatch):
    from amlhpc.core import invocation

    recipe = recipes.load("cosmoflow", local=True)
    monkeypatch.setattr(invocation, "from_clone", lambda: False)
    with pytest.raises(UserError) as info:
        requirements.check(recipe, env=with_azurite_env(), machine=machine(modules=set()))
    text = info.value.render()
    assert "torch numpy --index-url https://download.pytorch.org/whl/cpu" in text and " numpy" in text
    assert "make " not in text and ".venv/bin/python -m" not in text and "--python .venv" not in text


def test_prune_keeps_the_most_recent_and_the_current(tmp_path):
    made = []
    for i in range(7):
        folder = tmp_path / f"r{i}"
        folder.mkdir()
        os.utime(folder, (1000 + i, 1000 + i))
        made.append(folder)
    removed = folders.prune(tmp_path, keep=3, current=made[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r0", "r5", "r6"]
    assert {p.name for p in removed} == {"r1", "r2", "r3", "r4"}
