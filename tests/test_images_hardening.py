"""The images trust nothing on first contact: ssh checks host keys except for the job's own
nodes, every downloaded repository key must be the pinned one, and pip installs only files
whose hashes the lock names. Each rule is run on the real files and on the insecure version
it replaces, which must be refused."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from amlhpc.images import catalog, lint, locks
from amlhpc.images.pins import load_pins

ROOT = Path(__file__).resolve().parent.parent
COMMON = ROOT / "amlhpc" / "images" / "common"
VERIFY = COMMON / "bin" / "verify_signing_key.sh"
OLD_SSH_CONFIG = """Host *
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
"""


class TestSshConfig:
    def test_the_shipped_config_checks_host_keys(self):
        assert lint.check_ssh_config(COMMON / "ssh" / "aml-hpc.conf") == []

    def test_no_checking_for_every_host_is_refused(self, tmp_path):
        """The config the images shipped before: any key accepted from any host."""
        conf = tmp_path / "old.conf"
        conf.write_text(OLD_SSH_CONFIG)
        problems = lint.check_ssh_config(conf)
        assert len(problems) == 1 and "StrictHostKeyChecking no" in problems[0].message

    def test_accept_new_for_every_host_is_refused_too(self, tmp_path):
        conf = tmp_path / "wide.conf"
        conf.write_text("Host *\n    StrictHostKeyChecking accept-new\n")
        assert "for every host" in lint.check_ssh_config(conf)[0].message

    @pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client")
    def test_openssh_applies_the_exception_to_the_jobs_nodes_only(self, tmp_path):
        """Evaluated by the real ssh client (`ssh -G`): a node of this job gets accept-new in its
        own known_hosts file; any other host keeps OpenSSH's default (ask, ~/.ssh/known_hosts)."""
        matcher = tmp_path / "ssh-job-host"
        shutil.copy2(COMMON / "bin" / "ssh-job-host", matcher)
        conf = tmp_path / "config"
        conf.write_text((COMMON / "ssh" / "aml-hpc.conf").read_text().replace("/opt/aml-hpc/bin/ssh-job-host", str(matcher)))
        env = {**os.environ, "AZ_BATCH_HOST_LIST": "10.0.0.4,10.0.0.5", "HOME": str(tmp_path)}

        def effective(host: str) -> dict[str, str]:
            out = subprocess.run(["ssh", "-G", "-F", str(conf), host], env=env, capture_output=True, text=True,
                                 check=True).stdout
            return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)

        node = effective("10.0.0.5")
        assert node["stricthostkeychecking"] == "accept-new" and "known_hosts.aml-hpc-job" in node["userknownhostsfile"]
        for other in ("10.0.0.6", "github.com"):
            stranger = effective(other)
            assert stranger["stricthostkeychecking"] in ("ask", "true") and "aml-hpc-job" not in stranger["userknownhostsfile"]

    def test_the_mpi_host_file_and_the_jobs_own_list_count_as_nodes(self, tmp_path):
        hostfile = tmp_path / "hosts"
        hostfile.write_text("node-a slots=8\nnode-b slots=8\n")
        env = {"PATH": os.environ["PATH"], "AZ_BATCHAI_MPI_HOST_FILE": str(hostfile)}
        run = lambda host: subprocess.run([COMMON / "bin" / "ssh-job-host", host], env=env).returncode  # noqa: E731
        assert run("node-b") == 0 and run("node-c") == 1 and run("node") == 1


@pytest.mark.skipif(shutil.which("gpg") is None, reason="needs GnuPG")
class TestSigningKeys:
    """verify_signing_key.sh against real OpenPGP keys made for the test."""

    @pytest.fixture
    def keys(self, tmp_path):
        home = tmp_path / "gnupg"
        home.mkdir(mode=0o700)
        env = {**os.environ, "GNUPGHOME": str(home)}
        made = {}
        for who in ("pinned", "other"):
            subprocess.run(["gpg", "--batch", "--quiet", "--passphrase", "", "--quick-gen-key", f"{who} <{who}@example.com>",
                            "ed25519", "sign", "never"], env=env, check=True, capture_output=True)
            listing = subprocess.run(["gpg", "--with-colons", "--list-keys", f"{who}@example.com"], env=env, check=True,
                                     capture_output=True, text=True).stdout
            fpr = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr"))
            path = tmp_path / f"{who}.asc"
            path.write_text(subprocess.run(["gpg", "--armor", "--export", fpr], env=env, check=True, capture_output=True,
                                           text=True).stdout)
            made[who] = (path, fpr)
        both = tmp_path / "both.asc"
        both.write_text(made["pinned"][0].read_text() + made["other"][0].read_text())
        made["both"] = (both, "")
        return made

    def run(self, keyfile: Path, expected: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(VERIFY), str(keyfile), expected], capture_output=True, text=True)

    def test_the_pinned_key_passes_by_fingerprint_and_by_long_id(self, keys):
        path, fpr = keys["pinned"]
        assert self.run(path, fpr).returncode == 0
        assert self.run(path, fpr[-16:].lower()).returncode == 0

    def test_another_key_is_refused(self, keys):
        path, _ = keys["other"]
        done = self.run(path, keys["pinned"][1])
        assert done.returncode == 1 and "refusing to trust it" in done.stderr

    def test_a_file_with_a_second_key_is_refused(self, keys):
        done = self.run(keys["both"][0], keys["pinned"][1])
        assert done.returncode == 1 and "holds 2 primary keys" in done.stderr

    def test_a_malformed_pin_is_refused(self, keys):
        assert self.run(keys["pinned"][0], "A024-F6F0").returncode == 1


class TestKeyDownloads:
    def test_every_shipped_script_verifies_what_it_downloads(self):
        assert lint.check_common(ROOT) == []

    def test_trust_on_first_download_is_refused(self, tmp_path):
        """What install_ib_userspace.sh did before: fetch the DOCA key and hand it to apt."""
        script = tmp_path / "install.sh"
        script.write_text('curl -fsSL "${DOCA_REPO}/GPG-KEY-Mellanox.pub" -o /etc/apt/keyrings/doca.asc\n'
                          'echo "deb [signed-by=/etc/apt/keyrings/doca.asc] ${repo} ./" > /etc/apt/sources.list.d/doca.list\n')
        problems = lint.check_key_downloads(script)
        assert len(problems) == 1 and "trusts it unchecked" in problems[0].message

    def test_the_beeond_install_checks_the_beegfs_key(self):
        from amlhpc.jobs.beeond import scripts

        text = scripts.install(scripts.Layout())
        assert scripts.BEEGFS_KEY_FINGERPRINT in text and "--with-colons" in text
        assert "gpg --dearmor" not in text.split(scripts.BEEGFS_KEY_FINGERPRINT)[0].split("wget")[-1]


class TestPipHashes:
    def test_every_lock_is_current_and_hashed(self):
        assert locks.check_all(load_pins()) == []

    def test_a_dockerfile_pip_install_without_hashes_is_refused(self, tmp_path):
        spec = catalog.PYTORCH
        text = (ROOT / spec.dockerfile).read_text().replace(
            'RUN DS_BUILD_OPS=0 python -m pip install --no-cache-dir --require-hashes',
            'RUN python -m pip install --no-cache-dir "isal==1.9.1" && DS_BUILD_OPS=0 python -m pip install --no-cache-dir --require-hashes')
        path = tmp_path / "Dockerfile"
        path.write_text(text)
        problems = lint.check_dockerfile(spec, load_pins(), path)
        assert any("without --require-hashes" in p.message for p in problems)

    def test_a_lock_line_without_a_hash_is_refused(self, tmp_path):
        spec = catalog.PYTORCH
        text = locks.lock_path(spec).read_text()
        stripped = re.sub(r"isal==1\.9\.1 \\\n(\s+--hash=sha256:[0-9a-f]+( \\)?\n)+", "isal==1.9.1\n", text)
        assert stripped != text
        (tmp_path / locks.lock_path(spec).name).write_text(stripped)
        problems = locks.check_lock(spec, load_pins(), tmp_path)
        assert any(p.path == "isal" and "no --hash" in p.message for p in problems)

    def test_a_moved_pin_makes_the_lock_stale(self, tmp_path):
        spec = catalog.PYTORCH
        shutil.copy2(locks.lock_path(spec), tmp_path / locks.lock_path(spec).name)
        pins = load_pins().model_copy(update={"python": load_pins().python.model_copy(update={"isal": "1.9.0"})})
        problems = locks.check_lock(spec, pins, tmp_path)
        assert any("other pins" in p.message for p in problems)
        assert any(p.path == "isal" and "pins 1.9.0" in p.message for p in problems)

    def test_the_framework_is_never_reinstalled_from_a_lock(self):
        for spec in catalog.IMAGES:
            for variant in locks.lock_variants(spec):
                names = locks.requirements(locks.lock_path(spec, variant=variant).read_text())
                assert not set(names) & {"torch", "numpy", "tensorflow", "triton"}
