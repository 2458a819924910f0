"""Many machines: deploy/helm/values.yaml against Dagster's Helm chart, checked offline.

No cluster and no `helm` binary here: the values are validated against the chart's own values
schema (vendored, deploy/helm/schema/README.md says from which commit and what it leaves out),
more strictly than Helm does, and the settings that keep reruns safe are asserted one by one.
The chart's templates are not rendered and nothing is installed.
"""

import copy
import functools
import json
import re
import tomllib
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest
from jsonschema.exceptions import best_match

from idem_assets.defs.warehouse import ENGINES, PG_PASSWORD, engine, warehouse_slots
from idem_assets.landing.layout import LANDING_DIR_ENV

from .support import DEPLOY, WAREHOUSE_VARIABLES, inline_secrets, load_yaml

SCHEMA = DEPLOY / "helm" / "schema" / "values.schema.json"
NOT_VENDORED = {"$comment": "not vendored"}
QUANTITY = re.compile(r"(\d+)(m|Ki|Mi|Gi)?")
UNITS = {None: 1, "m": 0.001, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


def values() -> dict[str, Any]:
    return load_yaml("deploy/helm/values.yaml")


def chart_schema() -> dict[str, Any]:
    return json.loads(SCHEMA.read_text())


def offline(node: Any) -> Any:
    """The schema with its Kubernetes references dropped: they name a schema not vendored."""
    if isinstance(node, list):
        return [offline(item) for item in node]
    if not isinstance(node, dict):
        return node
    kept = {k: v for k, v in node.items() if not (k == "$ref" and not v.startswith("#"))}
    return {key: offline(value) for key, value in kept.items()}


def closed(node: Any) -> Any:
    """Every object the chart describes takes only the keys it names (Helm ignores the rest)."""
    if isinstance(node, list):
        return [closed(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: closed(value) for key, value in node.items()}
    if node.get("type") == "object" and "properties" in node:
        node.setdefault("additionalProperties", False)
    return node


def retarget(node: Any) -> Any:
    """References into the strict copies of the definitions (``strict__<name>``)."""
    if isinstance(node, list):
        return [retarget(item) for item in node]
    if not isinstance(node, dict):
        return node
    return {
        key: value.replace("#/$defs/", "#/$defs/strict__") if key == "$ref" else retarget(value)
        for key, value in node.items()
    }


def merged_with_defaults(node: Any) -> Any:
    """Without `required`, except inside list items.

    Helm validates these values merged onto the chart's defaults, so a required key of a map may
    come from the defaults; a list replaces the default list whole, so its items keep theirs.
    """
    if isinstance(node, list):
        return [merged_with_defaults(item) for item in node]
    if not isinstance(node, dict):
        return node
    return {
        key: retarget(value) if key == "items" else merged_with_defaults(value)
        for key, value in node.items()
        if not (key == "required" and isinstance(value, list))
    }


@functools.cache
def values_validator() -> jsonschema.Draft202012Validator:
    """The chart's schema as checked here: offline, closed, and as Helm merges defaults."""
    schema = closed(offline(chart_schema()))
    definitions = schema.pop("$defs")
    checked = merged_with_defaults(schema)
    checked["$defs"] = {name: merged_with_defaults(d) for name, d in definitions.items()}
    checked["$defs"] |= {f"strict__{name}": retarget(d) for name, d in definitions.items()}
    jsonschema.Draft202012Validator.check_schema(checked)
    return jsonschema.Draft202012Validator(checked)


def schema_errors(candidate: dict[str, Any]) -> list[str]:
    """Each place the values break the chart's schema, as path: message."""
    # Inside an anyOf (a value or null), the error of the branch that fits the value best.
    errors = [best_match([e]) for e in values_validator().iter_errors(candidate)]
    return sorted(f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in errors if e)


def code_server() -> dict[str, Any]:
    (deployment,) = values()["dagster-user-deployments"]["deployments"]
    return deployment


def run_launcher() -> dict[str, Any]:
    return values()["runLauncher"]["config"]["k8sRunLauncher"]


def server_env() -> dict[str, Any]:
    """The code server's variables: a value, or the secretKeyRef it is read from."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in code_server()["env"]}


def run_env() -> dict[str, str]:
    """The variables every run pod gets from the run launcher (envVars), by name."""
    return dict(item.split("=", 1) for item in run_launcher()["envVars"])


def bytes_or_cores(quantity: str) -> float:
    match = QUANTITY.fullmatch(quantity)
    assert match, quantity
    return int(match.group(1)) * UNITS[match.group(2)]


def test_the_values_use_only_keys_the_chart_defines_with_the_types_it_declares() -> None:
    assert schema_errors(values()) == []
    # Every top-level key set is one of the chart's, and its definition was vendored.
    properties = chart_schema()["properties"]
    assert set(values()) <= set(properties)
    assert all(properties[key] != NOT_VENDORED for key in values())


def misspell(v: dict[str, Any]) -> None:
    v["runLauncher"]["config"]["k8sRunLauncher"]["resource"] = {"limits": {"memory": "4Gi"}}


def mistype(v: dict[str, Any]) -> None:
    v["concurrency"]["runs"]["maxConcurrentRuns"] = "8"


def drop_port(v: dict[str, Any]) -> None:
    del v["dagster-user-deployments"]["deployments"][0]["port"]


def wrong_launcher(v: dict[str, Any]) -> None:
    v["runLauncher"]["type"] = "K8sJobLauncher"


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (misspell, "runLauncher.config.k8sRunLauncher: Additional properties are not allowed"),
        (mistype, "concurrency.runs.maxConcurrentRuns: '8' is not valid under any"),
        (drop_port, "dagster-user-deployments.deployments.0: 'port' is a required property"),
        (wrong_launcher, "runLauncher.type: 'K8sJobLauncher' is not one of"),
    ],
    ids=["misspelt-key", "wrong-type", "list-item-missing-a-key", "unknown-run-launcher"],
)
def test_the_schema_check_refuses_what_helm_would_refuse_or_silently_ignore(
    change: Callable[[dict[str, Any]], None], error: str
) -> None:
    broken = copy.deepcopy(values())
    change(broken)
    (found,) = schema_errors(broken)
    assert found.startswith(error), found


def test_each_run_is_a_pod_of_its_own_sized_by_the_run_launcher() -> None:
    assert values()["runLauncher"]["type"] == "K8sRunLauncher"
    # A run pod takes its environment, volumes and size from the run launcher alone: with this
    # on, the code server's own resources and env would be merged into every run pod.
    assert code_server()["includeConfigInLaunchedRuns"] == {"enabled": False}
    for resources in (run_launcher()["resources"], code_server()["resources"]):
        requests, limits = resources["requests"], resources["limits"]
        assert set(requests) == {"cpu", "memory"} and set(limits) == {"memory"}
        assert bytes_or_cores(limits["memory"]) >= bytes_or_cores(requests["memory"])
    # A run stages its window in memory as Arrow; the code server only loads definitions.
    run_memory = bytes_or_cores(run_launcher()["resources"]["requests"]["memory"])
    assert run_memory > bytes_or_cores(code_server()["resources"]["requests"]["memory"])


def test_the_code_server_serves_the_location_from_the_projects_image() -> None:
    deployment = code_server()
    project = tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())
    assert deployment["codeServerArgs"] == ["-m", project["tool"]["dagster"]["module_name"]]
    assert deployment["image"]["repository"] == "idem-assets"
    assert deployment["image"]["tag"] == project["project"]["version"]


def test_the_instance_is_on_postgresql_and_its_password_a_kubernetes_secret() -> None:
    postgresql = values()["postgresql"]
    # An existing server; the chart's bundled PostgreSQL is a test fixture, not storage.
    assert postgresql["enabled"] is False and "postgresqlPassword" not in postgresql
    assert values()["generatePostgresqlPasswordSecret"] is False
    assert values()["global"]["postgresqlSecretName"]
    instance = load_yaml("deploy/dagster.yaml")["storage"]["postgres"]["postgres_db"]
    assert postgresql["postgresqlScheme"] == instance["scheme"]
    # The image's instance file (the code server's) reaches the same database as the chart's.
    given = {name: value for name, value in server_env().items() if name.startswith("DAGSTER_")}
    assert given == {
        "DAGSTER_PG_HOST": postgresql["postgresqlHost"],
        "DAGSTER_PG_PORT": str(postgresql["service"]["port"]),
        "DAGSTER_PG_USER": postgresql["postgresqlUsername"],
        "DAGSTER_PG_DB": postgresql["postgresqlDatabase"],
    }
    # Those are what the file reads, but the password, which the chart itself sets in every
    # pod from the Secret global.postgresqlSecretName names.
    read = {setting["env"] for key, setting in instance.items() if key != "scheme"}
    assert read == set(given) | {"DAGSTER_PG_PASSWORD"}


def test_queue_limits_and_pools_are_those_of_the_instance_file() -> None:
    instance = load_yaml("deploy/dagster.yaml")
    runs, pools = instance["concurrency"]["runs"], instance["concurrency"]["pools"]
    concurrency = values()["concurrency"]
    assert concurrency["enabled"] is True
    assert concurrency["runs"] == {
        "maxConcurrentRuns": runs["max_concurrent_runs"],
        "tagConcurrencyLimits": runs["tag_concurrency_limits"],
    }
    assert concurrency["pools"] == {
        "defaultLimit": pools["default_limit"],
        "granularity": pools["granularity"],
    }
    # The queue's own block sets only its interval: the chart refuses run limits set twice.
    coordinator = values()["dagsterDaemon"]["runCoordinator"]
    assert coordinator["type"] == "QueuedRunCoordinator" and coordinator["enabled"] is True
    assert coordinator["config"]["queuedRunCoordinator"] == {
        "dequeueIntervalSeconds": instance["run_queue"]["dequeue_interval_seconds"]
    }
    # A dead run pod fails its run, which frees its pool slot.
    monitoring = values()["dagsterDaemon"]["runMonitoring"]
    assert monitoring["enabled"] is True and monitoring["startTimeoutSeconds"] > 0


def test_the_warehouse_is_an_engine_many_pods_may_write_never_a_duckdb_file(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, run = server_env(), run_env()
    name = server["IDEM_WAREHOUSE"]
    assert ENGINES[name].multi_writer and not ENGINES["duckdb"].multi_writer
    # Both read exactly what warehouse.py reads for that engine; nothing names a DuckDB file.
    wanted = WAREHOUSE_VARIABLES[name] | {LANDING_DIR_ENV}
    assert {n for n in server if n.startswith("IDEM_")} == wanted
    assert set(run) == wanted - {PG_PASSWORD}
    # Every run pod writes the same warehouse the code server describes.
    assert {n: server[n] for n in run} == run
    # The password: the same Secret's key, by reference in both.
    assert server[PG_PASSWORD] == {"secretKeyRef": {"name": "idem-warehouse", "key": PG_PASSWORD}}
    assert run_launcher()["envSecrets"] == [{"name": "idem-warehouse"}]
    # The location, given a run pod's settings, takes them: PostgreSQL with the pool's slots.
    for variable, value in run.items():
        monkeypatch.setenv(variable, value)
    assert engine().name == "postgres"
    slots = warehouse_slots()
    assert slots == 3
    runs = values()["concurrency"]["runs"]
    assert slots <= runs["tagConcurrencyLimits"][0]["limit"] <= runs["maxConcurrentRuns"]


def test_no_password_is_written_in_the_values() -> None:
    assert list(inline_secrets(values())) == []
    # The check sees each way a password could be written as a value.
    planted = copy.deepcopy(values())
    planted["postgresql"]["postgresqlPassword"] = "hunter2"
    env = planted["dagster-user-deployments"]["deployments"][0]["env"]
    env.append({"name": PG_PASSWORD, "value": "hunter2"})
    env_vars = planted["runLauncher"]["config"]["k8sRunLauncher"]["envVars"]
    env_vars.append(f"{PG_PASSWORD}=x")
    assert list(inline_secrets(planted)) == [
        ".postgresql.postgresqlPassword",
        f".dagster-user-deployments.deployments[0].env[{len(env) - 1}]: {PG_PASSWORD} has a value",
        f".runLauncher.config.k8sRunLauncher.envVars[{len(env_vars) - 1}]: {PG_PASSWORD}=...",
    ]


def test_every_pod_reads_the_landing_files_from_one_shared_claim() -> None:
    for pod, landing in ((code_server(), server_env()), (run_launcher(), run_env())):
        (volume,) = pod["volumes"]
        (mount,) = pod["volumeMounts"]
        assert volume["persistentVolumeClaim"] == {"claimName": "idem-landing"}
        assert mount == {
            "name": volume["name"],
            "mountPath": landing[LANDING_DIR_ENV],
            "readOnly": True,
        }
