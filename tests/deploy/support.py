"""deploy/ checked offline: no Docker daemon and no Kubernetes cluster run where the tests run."""

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from idem_assets.defs.warehouse import (
    DELTA_ROOT,
    PG_DB,
    PG_HOST,
    PG_PASSWORD,
    PG_PORT,
    PG_USER,
    SLOTS_ENV,
    WAREHOUSE_ENV,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
DEPLOY = REPO_ROOT / "deploy"

#: The variables idem_assets/defs/warehouse.py reads for each multi-writer engine.
WAREHOUSE_VARIABLES = {
    "postgres": {WAREHOUSE_ENV, SLOTS_ENV, PG_HOST, PG_PORT, PG_USER, PG_DB, PG_PASSWORD},
    "delta": {WAREHOUSE_ENV, SLOTS_ENV, DELTA_ROOT},
}

#: Names of settings that hold a secret, in environment variables and in chart keys.
SECRET_NAME = re.compile(r"password|secret|token|credential|access_key", re.IGNORECASE)
#: Keys that name a secret rather than hold one: a Secret's name, a reference, a switch.
SECRET_REFERENCE = re.compile(r"SecretName$|^secretKeyRef$|^envSecrets$|^generate", re.IGNORECASE)
#: A compose value read from the environment (or an .env file) when the file is loaded.
INTERPOLATED = re.compile(r"\$\{[A-Z0-9_]+:\?[^}]*\}")


def load_yaml(relative: str) -> Any:
    """A YAML file of the repository, parsed."""
    return yaml.safe_load((REPO_ROOT / relative).read_text())


def env_references(node: Any) -> Iterator[str]:
    """Every `env: NAME` in a Dagster yaml, at any depth."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "env" and isinstance(value, str):
                yield value
            else:
                yield from env_references(value)
    elif isinstance(node, list):
        for item in node:
            yield from env_references(item)


def inline_secrets(node: Any, path: str = "") -> Iterator[str]:
    """Where a secret is written as a value: a secret-named key, env entry or NAME=value."""
    if isinstance(node, dict):
        name = node.get("name")
        if isinstance(name, str) and SECRET_NAME.search(name) and "value" in node:
            yield f"{path}: {name} has a value"
        for key, value in node.items():
            inline = isinstance(value, str) and value and not INTERPOLATED.fullmatch(value)
            if inline and SECRET_NAME.search(str(key)) and not SECRET_REFERENCE.search(str(key)):
                yield f"{path}.{key}"
            yield from inline_secrets(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, item in enumerate(node):
            if isinstance(item, str) and SECRET_NAME.search(item.partition("=")[0]):
                yield f"{path}[{index}]: {item.partition('=')[0]}=..."
            yield from inline_secrets(item, f"{path}[{index}]")
