"""One machine: deploy/Dockerfile and docker-compose.yaml, checked statically.

No Docker daemon runs here, so nothing is built or started: the files are parsed and held against
the code they name. The one live part: the compose file's init script runs on a real PostgreSQL,
and the code location, given the compose environment, writes the database it creates.
"""

import copy
import re
import tomllib
from pathlib import Path
from typing import Any

import dagster as dg
import pandas as pd
import pytest
import yaml

from idem_assets.defs.warehouse import ENGINES, PG_HOST, PG_PASSWORD, PG_PORT, postgres_io_managers
from idem_assets.landing.layout import LANDING_DIR_ENV
from tests.postgres_server import PostgresServer

from .support import (
    DEPLOY,
    INTERPOLATED,
    REPO_ROOT,
    WAREHOUSE_VARIABLES,
    env_references,
    inline_secrets,
    load_yaml,
)

APP_DIR = "/opt/dagster/app"
DAGSTER_SERVICES = ("code-location", "webserver", "daemon")
GRPC_PORT = "4000"
INIT_DIR = "/docker-entrypoint-initdb.d"


def compose() -> dict[str, Any]:
    return load_yaml("deploy/docker-compose.yaml")


def pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) for each instruction of deploy/Dockerfile."""
    lines = (DEPLOY / "Dockerfile").read_text().splitlines()
    instructions = []
    for line in lines:
        if line.strip() and not line.lstrip().startswith("#"):
            keyword, _, rest = line.strip().partition(" ")
            instructions.append((keyword.upper(), rest))
    return instructions


def image_extras() -> list[str]:
    """The extras deploy/Dockerfile installs unless a build argument says otherwise."""
    (default,) = [args for keyword, args in dockerfile_instructions() if keyword == "ARG"]
    name, _, value = default.partition("=")
    assert name == "EXTRAS"
    return value.split(",")


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
    assert pyproject()["project"]["readme"] in sources
    assert ("WORKDIR", APP_DIR) in dockerfile_instructions()


def test_the_image_installs_only_the_extras_its_deployment_uses() -> None:
    extras = pyproject()["project"]["optional-dependencies"]
    runs = [args for keyword, args in dockerfile_instructions() if keyword == "RUN"]
    assert 'pip install --no-cache-dir ".[${EXTRAS}]"' in runs
    # The image's default is the Kubernetes deployment's: PostgreSQL, and the run launcher
    # that every run pod's instance names. Compose runs each run as a code-server process.
    assert image_extras() == ["postgres", "k8s"]
    assert compose()["services"]["code-location"]["build"]["args"] == {
        "EXTRAS": "postgres,webserver"
    }
    packages = {
        extra: {re.split(r"[<>=\[]", requirement)[0] for requirement in extras[extra]}
        for extra in ("postgres", "delta", "k8s", "webserver")
    }
    assert packages == {
        "postgres": {"adbc-driver-postgresql", "dagster-postgres", "psycopg2-binary"},
        "delta": {"deltalake"},
        "k8s": {"dagster-k8s"},
        "webserver": {"dagster-webserver"},
    }
    # The engines are extras only: a deployment without them installs none of their drivers.
    core = {re.split(r"[<>=\[]", r)[0] for r in pyproject()["project"]["dependencies"]}
    assert not core & {p for extra in packages.values() for p in extra}


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


def warehouse_environment() -> dict[str, str]:
    """The code location's IDEM_* variables in the compose file."""
    environment = compose()["services"]["code-location"]["environment"]
    return {name: value for name, value in environment.items() if name.startswith("IDEM_")}


def init_scripts() -> list[Path]:
    """The files the postgres image runs on an empty data volume, from the mounted folder."""
    (mount,) = [m for m in compose()["services"]["postgres"]["volumes"] if INIT_DIR in m]
    folder = (DEPLOY / mount.split(":")[0]).resolve()
    return sorted(folder.glob("*.sql"))


def test_the_code_location_writes_the_compose_postgresql_never_a_duckdb_file() -> None:
    services = compose()["services"]
    warehouse = warehouse_environment()
    engine = warehouse["IDEM_WAREHOUSE"]
    assert engine == "postgres" and ENGINES[engine].multi_writer
    # Exactly what warehouse.py reads for PostgreSQL, and the landing zone; no DuckDB path.
    assert set(warehouse) == (WAREHOUSE_VARIABLES[engine] - {"IDEM_WAREHOUSE_SLOTS"}) | {
        LANDING_DIR_ENV
    }
    assert warehouse[PG_HOST] == "postgres" and warehouse[PG_PORT] == "5432"
    postgres = services["postgres"]["environment"]
    assert warehouse["IDEM_PG_USER"] == postgres["POSTGRES_USER"]
    assert warehouse[PG_PASSWORD] == postgres["POSTGRES_PASSWORD"]
    assert INTERPOLATED.fullmatch(warehouse[PG_PASSWORD])
    # The warehouse database is one the init script creates, not the instance's.
    assert warehouse["IDEM_PG_DB"] != postgres["POSTGRES_DB"]
    created = [
        re.findall(r"^CREATE DATABASE (\w+);$", script.read_text(), re.MULTILINE)
        for script in init_scripts()
    ]
    assert created == [[warehouse["IDEM_PG_DB"]]]
    # The code location's one volume holds the landing files; no volume holds a warehouse file.
    assert services["code-location"]["volumes"] == [f"landing:{warehouse[LANDING_DIR_ENV]}"]
    assert set(compose()["volumes"]) == {"postgres-data", "landing"}


def test_every_service_is_health_checked_and_waits_for_what_it_needs() -> None:
    services = compose()["services"]
    assert set(services) == {"postgres", *DAGSTER_SERVICES}
    for service in services.values():
        assert service["healthcheck"]["test"][0] == "CMD"
    # Over TCP: while the postgres image runs the init scripts it listens on its socket only.
    probe = services["postgres"]["healthcheck"]["test"]
    assert probe[1:4] == ["pg_isready", "-h", "127.0.0.1"]
    assert probe[probe.index("-d") + 1] == warehouse_environment()["IDEM_PG_DB"]
    waits = {name: service.get("depends_on", {}) for name, service in services.items()}
    assert waits == {
        "postgres": {},
        "code-location": {"postgres": {"condition": "service_healthy"}},
        "webserver": {"code-location": {"condition": "service_healthy"}},
        "daemon": {"code-location": {"condition": "service_healthy"}},
    }


def test_no_password_is_written_in_the_compose_file() -> None:
    assert list(inline_secrets(compose())) == []
    # The check sees a password written as a value.
    planted = copy.deepcopy(compose())
    planted["services"]["code-location"]["environment"][PG_PASSWORD] = "hunter2"
    assert list(inline_secrets(planted)) == [f".services.code-location.environment.{PG_PASSWORD}"]


def test_the_services_run_the_code_server_and_load_the_workspace_the_image_holds() -> None:
    services = compose()["services"]
    module = pyproject()["tool"]["dagster"]["module_name"]
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


def test_the_init_script_creates_the_database_the_code_location_then_writes(
    postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compose environment, pointed at a real server, publishes into the script's database."""
    (script,) = init_scripts()
    postgres_server.psql(script.read_text())
    warehouse = warehouse_environment()
    try:
        for name, value in warehouse.items():
            monkeypatch.setenv(name, value)
        # Only where the server is differs from the compose file: a throwaway one on loopback.
        monkeypatch.setenv(PG_HOST, postgres_server.host)
        monkeypatch.setenv(PG_PORT, str(postgres_server.port))
        monkeypatch.setenv("IDEM_PG_USER", postgres_server.user)
        monkeypatch.setenv(PG_PASSWORD, postgres_server.password)
        overwrite, _ = postgres_io_managers()

        @dg.asset(
            partitions_def=dg.DailyPartitionsDefinition(start_date="2026-01-01"),
            metadata={"partition_expr": "day"},
        )
        def counts(context: dg.AssetExecutionContext) -> pd.DataFrame:
            day = pd.Timestamp(context.partition_key)
            return pd.DataFrame({"day": [day, day], "n": [1, 2]})

        for _ in range(2):
            dg.materialize(
                [counts], resources={"io_manager": overwrite}, partition_key="2026-01-02"
            )
        table = postgres_server.psql(
            "SELECT day, n FROM main.counts ORDER BY n", warehouse["IDEM_PG_DB"]
        )
        assert table == "2026-01-02 00:00:00|1\n2026-01-02 00:00:00|2\n"
    finally:
        postgres_server.psql(f"DROP DATABASE {warehouse['IDEM_PG_DB']} WITH (FORCE)")
