"""The Iceberg backend with its warehouse on object storage: moto's S3 server on 127.0.0.1,
reached through pyiceberg's s3.* properties (pyarrow's S3 filesystem, no s3fs)."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import dagster as dg
import pytest
from moto.server import ThreadedMotoServer

import idem_assets as ia
from idem_assets.lib.backends.iceberg.catalog import IcebergLocation
from tests.conformance.test_replace_contract import ALL_DAYS, events
from tests.conformance.test_replace_contract import asset as contract_asset
from tests.iceberg.conftest import expected, stored


@pytest.fixture(scope="module")
def s3() -> Iterator[dict[str, str]]:
    """pyiceberg properties for a bucket on a local S3-compatible server."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        client: Any = boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )
        client.create_bucket(Bucket="lake")
        yield {
            "s3.endpoint": endpoint,
            "s3.access-key-id": "testing",
            "s3.secret-access-key": "testing",
            "s3.region": "us-east-1",
            # The local server takes path-style requests only.
            "s3.force-virtual-addressing": "false",
        }
    finally:
        server.stop()


def test_io_managers_write_and_read_iceberg_tables_on_s3(
    s3: dict[str, str], tmp_path: Path
) -> None:
    catalog = f"sqlite:///{tmp_path / 'catalog.db'}"
    config = {"catalog_uri": catalog, "warehouse": "s3://lake/warehouse", "properties": s3}
    resources = {"io_manager": ia.IcebergOverwriteIOManager(**config)}
    source = contract_asset(lambda c: events(c.partition_key))
    for day in ALL_DAYS:
        dg.materialize([source], resources=resources, partition_key=day)
    rerun = dg.materialize([source], resources=resources, partition_key=ALL_DAYS[1])
    location = IcebergLocation(catalog, "s3://lake/warehouse", properties=s3)
    assert stored(location) == expected(*[events(d) for d in ALL_DAYS])
    metadata = rerun.get_asset_materialization_events()[0].materialization.metadata
    assert metadata["iceberg_table_location"].value.startswith("s3://lake/warehouse/")
    client: Any = boto3.client(
        "s3",
        endpoint_url=s3["s3.endpoint"],
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    keys = [o["Key"] for o in client.list_objects_v2(Bucket="lake")["Contents"]]
    assert any(k.endswith(".parquet") for k in keys) and any(
        k.endswith(".metadata.json") for k in keys
    )
