"""docs/deploy.md's commands: each `bash` block run as printed, the rest marked and left alone.

The rule: a fenced block whose info string is exactly `bash` runs here; `bash requires-docker`
(a Docker daemon) and `bash requires-cluster` (Helm, kubectl and a Kubernetes cluster) are
never run, because neither exists where the tests run; any other shell block fails the test.
"""

import importlib.metadata
import os
import re
import subprocess

import pytest

from .support import REPO_ROOT

DOC = REPO_ROOT / "docs" / "deploy.md"
BLOCK = re.compile(r"^```([^\n]*)\n(.*?)\n```$", re.MULTILINE | re.DOTALL)
SHELLS = {"bash", "sh", "shell", "console", "zsh"}
NOT_RUN_HERE = {"requires-docker", "requires-cluster"}


def blocks() -> list[tuple[str, str]]:
    """(info string, body) of each fenced block of the page."""
    return BLOCK.findall(DOC.read_text())


def shell_blocks(marker: str | None) -> list[str]:
    """The bodies of the shell blocks with ``marker`` after the language (None: unmarked)."""
    found = []
    for info, body in blocks():
        language, _, rest = info.partition(" ")
        if language in SHELLS and (rest.strip() or None) == marker:
            found.append(body)
    return found


def test_every_shell_block_is_run_here_or_marked_as_needing_docker_or_a_cluster() -> None:
    for info, _ in blocks():
        language, _, marker = info.partition(" ")
        if language in SHELLS:
            assert language == "bash" and marker in {"", *NOT_RUN_HERE}, info
    assert shell_blocks(None), "nothing on the page would be run"
    assert all(shell_blocks(marker) for marker in NOT_RUN_HERE)


def test_the_chart_installed_is_the_version_of_the_dagster_the_project_runs() -> None:
    (install,) = [body for body in shell_blocks("requires-cluster") if "helm upgrade" in body]
    versions = set(re.findall(r"--version (\S+)", install))
    assert versions == {importlib.metadata.version("dagster")}
    assert "-f deploy/helm/values.yaml" in install


@pytest.mark.slow
@pytest.mark.parametrize("command", shell_blocks(None))
def test_each_command_runs_as_printed(command: str) -> None:
    env = {**os.environ, "PATH": f"{REPO_ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "-c", command], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = done.stdout.strip().splitlines()[-1]
    # Every check ran and passed: nothing skipped, nothing failed.
    assert re.search(r"^\d+ passed", summary) and "skipped" not in summary, summary
