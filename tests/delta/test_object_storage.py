"""The Delta backend on object storage: moto's S3 server on 127.0.0.1, reached through the
storage options a deployment on S3 passes."""

from collections.abc import Iterator
from typing import Any

import boto3
import dagster as dg
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from moto.server import ThreadedMotoServer

import idem_assets as ia
from idem_assets.lib.backends.delta.backend import DeltaBackend
from idem_assets.lib.backends.delta.layout import DAY_COLUMN
from tests.conformance.conftest import Store
from tests.conformance.test_replace_contract import ALL_DAYS, EVENTS, events
from tests.delta.test_delta_backend import daily_events, expected, first_writers_of_one_day
from tests.helpers import NOW, settings, window


@pytest.fixture(scope="module")
def s3() -> Iterator[dict[str, str]]:
    """Storage options for a bucket on a local S3-compatible server."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        options = {
            "AWS_ENDPOINT_URL": f"http://{host}:{port}",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1",
            # The local server speaks plain HTTP; S3 itself needs no such option.
            "AWS_ALLOW_HTTP": "true",
        }
        client: Any = boto3.client(
            "s3",
            endpoint_url=options["AWS_ENDPOINT_URL"],
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )
        client.create_bucket(Bucket="lake")
        yield options
    finally:
        server.stop()


def stored(uri: str, options: dict[str, str]) -> list[tuple]:
    table = DeltaTable(uri, storage_options=options).to_pyarrow_table()
    return sorted(zip(*table.drop_columns([DAY_COLUMN]).to_pydict().values(), strict=True))


def test_io_managers_write_and_read_delta_tables_on_s3(s3: dict[str, str]) -> None:
    root = "s3://lake/materialized"
    resources = {"io_manager": ia.DeltaOverwriteIOManager(root=root, storage_options=s3)}
    for day in ALL_DAYS:
        dg.materialize([daily_events], resources=resources, partition_key=day)
    rerun = dg.materialize(
        [daily_events], resources=resources, partition_key=ALL_DAYS[1], tags={"version": "3"}
    )
    version = rerun.get_asset_materialization_events()[0].materialization.metadata
    assert (
        version["delta_version"].value
        == DeltaTable(f"{root}/main/daily_events", storage_options=s3).version()
    )
    assert stored(f"{root}/main/daily_events", s3) == expected(
        events(ALL_DAYS[0]), events(ALL_DAYS[1], version=3), events(ALL_DAYS[2])
    )


def test_a_commit_racing_another_on_s3_starts_over_and_leaves_one_batch(
    s3: dict[str, str],
) -> None:
    """The log's put-if-absent on S3: the losing commit is detected, never overwritten."""
    root = "s3://lake/racing"

    def publish(batch: pa.Table, on_stage: Any = None) -> None:
        with DeltaBackend(root, s3) as backend:
            ia.publish(
                backend,
                batch,
                settings("overwrite", EVENTS, table="events"),
                window(ALL_DAYS[1]),
                now=NOW,
                on_stage=on_stage,
            )

    publish(events(ALL_DAYS[1]))
    attempts: list[str] = []

    def another_writer_commits_first(stage: str) -> None:
        if stage == "before_commit":
            attempts.append(stage)
            if len(attempts) == 1:
                publish(events(ALL_DAYS[1], version=2))

    publish(events(ALL_DAYS[1], version=1), another_writer_commits_first)
    assert len(attempts) == 2
    assert stored(f"{root}/main/events", s3) == expected(events(ALL_DAYS[1], version=1))


@pytest.mark.slow
def test_first_writers_of_a_new_table_on_s3_leave_one_batch(s3: dict[str, str]) -> None:
    """The creation race on S3: the second creation is detected, and starts over on the first."""
    root = "s3://lake/first"

    def rows(table: str) -> list[tuple]:
        return stored(f"{root}/main/{table}", s3)

    config = {"root": root, "storage_options": s3}
    store = Store("delta", lambda: DeltaBackend(root, s3), config, rows, lambda: {})
    first_writers_of_one_day(store, s3)
