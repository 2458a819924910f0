"""The shell commands the docs print, read from their ```bash blocks, verbatim."""

import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
#: The pages whose `dagster` and `dg` commands the first-hour tests run on a fresh instance.
DOCUMENTS = (REPO_ROOT / "docs" / "code-location.md", REPO_ROOT / "docs" / "backfills.md")
_BASH_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.MULTILINE | re.DOTALL)


def bash_commands(text: str) -> list[str]:
    """Every command of every ```bash block, a backslash-continued command as one string."""
    commands: list[str] = []
    for block in _BASH_BLOCK.findall(text):
        pending = ""
        for line in block.splitlines():
            if not pending and (not line.strip() or line.lstrip().startswith("#")):
                continue
            pending += line
            if line.rstrip().endswith("\\"):
                pending += "\n"
                continue
            commands.append(pending)
            pending = ""
    return commands


def dagster_commands() -> list[str]:
    """The `dagster` and `dg` commands of those pages, in order, each once."""
    found: list[str] = []
    for document in DOCUMENTS:
        for command in bash_commands(document.read_text()):
            if command.split()[0] in ("dagster", "dg") and command not in found:
                found.append(command)
    return found
