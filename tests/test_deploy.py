"""deploy/ checked offline (no Docker daemon here): the files it names exist and agree."""

import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
DEPLOY = REPO_ROOT / "deploy"
APP_DIR = "/opt/dagster/app"
DAGSTER_SERVICES = ("code-location", "webserver", "daemon")
GRPC_PORT = "4000"


def compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "docker-compose.yaml").read_text())


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) for each instruction of deploy/Dockerfile."""
    lines = (DEPLOY / "Dockerfile").read_text().splitlines()
    instructions = []
    for line in lines:
        if line.strip() and not line.lstrip().startswith("#"):
            keyword, _, rest = line.strip().partition(" ")
            instructions.append((keyword.upper(), rest))
    return instructions


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


def instance_env_names() -> set[str]:
    names = set()
    for name in ("dagster.yaml", "workspace.yaml"):
        names |= set(env_references(yaml.safe_load((DEPLOY / name).read_text())))
    return names


def test_every_file_the_dockerfile_copies_exists_and_nothing_else_is_needed() -> None:
    copies = [args.split() for keyword, args in dockerfile_instructions() if keyword == "COPY"]
    sources = [source for args in copies for source in args[:-1]]
    assert sources == ["pyproject.toml", "README.md", "idem_assets", "deploy"]
    assert all((REPO_ROOT / source).exists() for source in sources)
    # pyproject's readme must be in the image, or `pip install .` fails to build the package.
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["readme"] in sources
    assert ("WORKDIR", APP_DIR) in dockerfile_instructions()


def test_the_compose_build_points_at_the_dockerfile_from_the_repository_root() -> None:
    build = compose()["services"]["code-location"]["build"]
    context = (DEPLOY / build["context"]).resolve()
    assert context == REPO_ROOT
    assert (context / build["dockerfile"]).resolve() == DEPLOY / "Dockerfile"
    # BuildKit reads <Dockerfile>.dockerignore; the venv and local data stay out of the image.
    ignored = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    assert {".venv", ".data", ".dagster_home"} <= set(ignored)


@pytest.mark.parametrize("service", DAGSTER_SERVICES)
def test_each_service_gets_exactly_the_variables_the_instance_reads(service: str) -> None:
    environment = compose()["services"][service]["environment"]
    dagster_names = {name for name in environment if name.startswith("DAGSTER_")}
    assert dagster_names == instance_env_names()
    assert instance_env_names() == {
        "DAGSTER_PG_HOST",
        "DAGSTER_PG_PORT",
        "DAGSTER_PG_USER",
        "DAGSTER_PG_PASSWORD",
        "DAGSTER_PG_DB",
        "DAGSTER_GRPC_HOST",
        "DAGSTER_GRPC_PORT",
    }
    assert environment["DAGSTER_PG_HOST"] == "postgres"
    assert environment["DAGSTER_GRPC_HOST"] == "code-location"
    assert environment["DAGSTER_GRPC_PORT"] == GRPC_PORT
    # The password is interpolated from the environment, never written in the file.
    assert re.fullmatch(r"\$\{DAGSTER_PG_PASSWORD:\?[^}]*\}", environment["DAGSTER_PG_PASSWORD"])


def test_postgres_creates_the_login_and_database_the_instance_uses() -> None:
    services = compose()["services"]
    postgres = services["postgres"]["environment"]
    instance = services["daemon"]["environment"]
    assert postgres["POSTGRES_USER"] == instance["DAGSTER_PG_USER"]
    assert postgres["POSTGRES_DB"] == instance["DAGSTER_PG_DB"]
    assert postgres["POSTGRES_PASSWORD"] == instance["DAGSTER_PG_PASSWORD"]
    assert services["postgres"]["image"] == "postgres:15"


def test_the_services_run_the_code_server_and_load_the_workspace_the_image_holds() -> None:
    services = compose()["services"]
    module = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["dagster"][
        "module_name"
    ]
    code_server = services["code-location"]["command"]
    (cmd,) = [args for keyword, args in dockerfile_instructions() if keyword == "CMD"]
    # The image's default command and the compose service run the same code server.
    assert yaml.safe_load(cmd) == code_server
    assert code_server[:3] == ["dagster", "code-server", "start"]
    assert code_server[code_server.index("-p") + 1] == GRPC_PORT
    assert code_server[code_server.index("-m") + 1] == module
    for name in ("webserver", "daemon"):
        command = services[name]["command"]
        workspace = command[command.index("-w") + 1]
        assert workspace == f"{APP_DIR}/deploy/workspace.yaml"
        assert (REPO_ROOT / Path(workspace).relative_to(APP_DIR)).is_file()
        assert services[name]["image"] == services["code-location"]["image"]
    assert services["webserver"]["command"][0] == "dagster-webserver"
    assert services["daemon"]["command"][:2] == ["dagster-daemon", "run"]
