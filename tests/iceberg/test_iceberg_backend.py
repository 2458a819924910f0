"""What the Iceberg backend does beyond the conformance suite: one snapshot per publish, time
travel from the published metadata, loads that read only the window's files, the owner
property and its handover, refusals that write nothing, and Iceberg's types."""

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow as pa
import pytest
from pyiceberg.table import StaticTable

import idem_assets as ia
from idem_assets.lib.backends.iceberg.backend import IcebergBackend
from idem_assets.lib.backends.iceberg.catalog import IcebergLocation
from idem_assets.lib.backends.iceberg.commit import OWNER_PROPERTY
from idem_assets.testing import assert_rerun_safe
from tests.conformance.test_replace_contract import ALL_DAYS, EVENTS, REFUSALS, events
from tests.conformance.test_replace_contract import asset as contract_asset
from tests.helpers import NOW, range_tags, settings, step_failure, window
from tests.iceberg.conftest import expected, files_on_disk, fill, publish, stored
from tests.iceberg.rest_server import RestCatalogServer
from tests.test_testing_kit import RANGE, latest_orders, orders


def table_of(location: IcebergLocation, table: str = "events") -> Any:
    with IcebergBackend(location) as backend:
        return backend.catalog.load_table(("main", table))


def operations(location: IcebergLocation) -> list[str]:
    """Each snapshot's operation on main's history, oldest first."""
    found = table_of(location)
    by_id = {s.snapshot_id: s for s in found.snapshots()}
    return [by_id[h.snapshot_id].summary.operation.value for h in found.history()]


def metadata_files(location: IcebergLocation) -> int:
    return sum(1 for f in files_on_disk(location) if f.endswith(".metadata.json"))


@pytest.mark.parametrize("mode", ["overwrite", "merge"])
def test_each_publish_is_one_snapshot_and_one_metadata_file(
    location: IcebergLocation, mode: str
) -> None:
    publish(location, events(ALL_DAYS[0]), mode, ALL_DAYS[0])
    # The first publish creates the table with its rows and owner: one commit, one snapshot.
    assert len(table_of(location).snapshots()) == 1
    assert metadata_files(location) == 1
    publish(location, events(ALL_DAYS[1]), mode, ALL_DAYS[1])
    publish(location, events(ALL_DAYS[1], version=1), mode, ALL_DAYS[1])
    publish(location, pa.concat_tables([events(d, version=2) for d in ALL_DAYS]), mode, *ALL_DAYS)
    assert len(operations(location)) == 4
    assert metadata_files(location) == 4
    assert operations(location)[1:] == ["overwrite"] * 3
    assert stored(location) == expected(*[events(d, version=2) for d in ALL_DAYS])


def test_pyiceberg_overwrite_records_an_empty_window_in_between(location: IcebergLocation) -> None:
    """The failure one snapshot per publish avoids: pyiceberg's overwrite is DELETE + APPEND."""
    fill(location)
    found = table_of(location)
    day = window(ALL_DAYS[1])
    from idem_assets.lib.backends.iceberg.expressions import region_filter
    from idem_assets.lib.model.windows import region_for

    types = {"event_at": pa.timestamp("us")}
    day_filter = region_filter(region_for(day, (("", "event_at"),), types), types)
    found.overwrite(events(ALL_DAYS[1], version=1), overwrite_filter=day_filter)
    found = table_of(location)
    assert operations(location)[-2:] == ["delete", "append"]
    between = found.history()[-2].snapshot_id
    assert len(stored(location, snapshot_id=between)) == 2000


def test_time_travel_to_the_published_snapshot_reads_exactly_what_it_wrote(
    location: IcebergLocation,
) -> None:
    versions = {"v": 0}

    def source(context: dg.AssetExecutionContext) -> pa.Table:
        return events(context.partition_key, version=versions["v"])

    resources = {
        "io_manager": ia.IcebergOverwriteIOManager(
            catalog_uri=location.uri, warehouse=location.warehouse
        )
    }
    first = dg.materialize([contract_asset(source)], resources=resources, partition_key=ALL_DAYS[1])
    written = first.get_asset_materialization_events()[0].materialization.metadata
    snapshot_id = written["iceberg_snapshot_id"].value
    metadata_location = written["iceberg_metadata_location"].value
    assert written["iceberg_table_location"].value == table_of(location).location()
    versions["v"] = 7
    dg.materialize([contract_asset(source)], resources=resources, partition_key=ALL_DAYS[1])
    assert stored(location) == expected(events(ALL_DAYS[1], version=7))
    # By id through the catalog, and without one from the metadata file the publish reported.
    assert stored(location, snapshot_id=snapshot_id) == expected(events(ALL_DAYS[1]))
    static = StaticTable.from_metadata(metadata_location)
    assert static.current_snapshot().snapshot_id == snapshot_id
    rows = static.scan().to_arrow()
    assert sorted(zip(*rows.to_pydict().values(), strict=True)) == expected(events(ALL_DAYS[1]))
    summary = table_of(location).snapshot_by_id(snapshot_id).summary.additional_properties
    assert summary["idem_assets.asset"] == "events"
    assert summary["idem_assets.partitions"] == ALL_DAYS[1]


def test_a_load_reads_only_the_windows_files(location: IcebergLocation) -> None:
    fill(location)
    with IcebergBackend(location) as backend:
        one = backend.load(
            settings("overwrite", EVENTS, table="events"), window(ALL_DAYS[1]), False, True
        )
        assert backend.files_read == 1
        assert isinstance(one, pa.Table) and one.num_rows == 1000
        two = backend.load(
            settings("overwrite", EVENTS, table="events"), window(*ALL_DAYS[1:]), False, True
        )
        assert backend.files_read == 2 and two.num_rows == 2000
        backend.load(settings("overwrite", EVENTS, table="events"), None, False, True)
        assert backend.files_read == 3
    assert len(table_of(location).inspect.files()) == 3


def test_an_hour_inside_a_days_files_is_replaced_alone(location: IcebergLocation) -> None:
    """A window finer than the table's day partitions rewrites its day's file, keeping the rest."""
    hourly = dg.HourlyPartitionsDefinition(start_date="2026-01-01-00:00")
    day = events(ALL_DAYS[0])
    meta = settings("overwrite", EVENTS, table="events", partitions_def=hourly)
    with IcebergBackend(location) as backend:
        hours = [f"2026-01-01-{h:02d}:00" for h in range(24)]
        ia.publish(backend, day, meta, ia.window_from_keys(hourly, hours, "events"), now=NOW)
    hour = ia.window_from_keys(hourly, ["2026-01-01-03:00"], "events")
    start = datetime(2026, 1, 1, 3)
    inside = [start <= t < start + timedelta(hours=1) for t in day.column("event_at").to_pylist()]
    newer = events(ALL_DAYS[0], version=5).filter(pa.array(inside))
    with IcebergBackend(location) as backend:
        result = ia.publish(backend, newer, meta, hour, now=NOW)
    assert result.rows == newer.num_rows == 45
    kept = day.filter(pa.array([not i for i in inside]))
    assert stored(location) == expected(kept, newer)
    assert len(table_of(location).snapshots()) == 2


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_a_refusal_writes_no_file_and_no_snapshot(location: IcebergLocation, case: str) -> None:
    source, io_manager, error = REFUSALS[case]
    resources = {
        "io_manager": ia.IcebergOverwriteIOManager(
            catalog_uri=location.uri, warehouse=location.warehouse
        ),
        "merge_io_manager": ia.IcebergMergeIOManager(
            catalog_uri=location.uri, warehouse=location.warehouse
        ),
    }
    for day in ALL_DAYS:
        good = contract_asset(lambda c: events(c.partition_key), io_manager=io_manager)
        dg.materialize([good], resources=resources, partition_key=day)
    before, snapshots = files_on_disk(location), len(table_of(location).snapshots())
    result = dg.materialize(
        [contract_asset(source, io_manager=io_manager)],
        resources=resources,
        partition_key=ALL_DAYS[1],
        raise_on_error=False,
    )
    assert not result.success
    assert error in step_failure(result)
    assert files_on_disk(location) == before
    assert len(table_of(location).snapshots()) == snapshots


def test_a_table_of_another_asset_is_refused_and_the_printed_handover_works(
    location: IcebergLocation,
) -> None:
    fill(location)
    renamed = settings("overwrite", EVENTS, table="events")
    renamed = type(renamed)(**{**renamed.__dict__, "asset": "events_v2"})
    with IcebergBackend(location) as backend, pytest.raises(ia.ConfigurationError) as refused:
        ia.publish(backend, events(ALL_DAYS[1]), renamed, window(ALL_DAYS[1]), now=NOW)
    text = str(refused.value)
    assert "belongs to asset 'events'" in text and "Nothing was changed. Fix:" in text
    code = text.split("hand the table over first: ", 1)[1].removesuffix(".")
    exec(code, {})  # the fix, run exactly as printed
    assert table_of(location).properties[OWNER_PROPERTY] == "events_v2"
    with IcebergBackend(location) as backend:
        ia.publish(backend, events(ALL_DAYS[1], version=3), renamed, window(ALL_DAYS[1]), now=NOW)
    assert stored(location) == expected(
        events(ALL_DAYS[0]), events(ALL_DAYS[1], version=3), events(ALL_DAYS[2])
    )


def test_the_printed_handover_on_postgres_reads_the_password_from_the_environment(
    postgres_catalog: IcebergLocation,
) -> None:
    fill(postgres_catalog)
    renamed = settings("overwrite", EVENTS, table="events")
    renamed = type(renamed)(**{**renamed.__dict__, "asset": "events_v3"})
    with IcebergBackend(postgres_catalog) as backend, pytest.raises(ia.ConfigurationError) as no:
        ia.publish(backend, events(ALL_DAYS[1]), renamed, window(ALL_DAYS[1]), now=NOW)
    text = str(no.value)
    password = postgres_catalog.catalog_uri().split(":")[2].split("@")[0]
    assert password and password not in text
    exec(text.split("hand the table over first: ", 1)[1].removesuffix("."), {})
    assert table_of(postgres_catalog).properties[OWNER_PROPERTY] == "events_v3"


def test_a_range_run_through_dagster_is_one_snapshot_with_each_days_counts(
    location: IcebergLocation,
) -> None:
    fill(location)
    ranged = contract_asset(
        lambda c: pa.concat_tables([events(d, version=4) for d in c.partition_keys])
    )
    resources = {
        "io_manager": ia.IcebergOverwriteIOManager(
            catalog_uri=location.uri, warehouse=location.warehouse
        )
    }
    result = dg.materialize(
        [ranged], resources=resources, tags=range_tags(ALL_DAYS[0], ALL_DAYS[-1])
    )
    counts = {
        e.materialization.partition: e.materialization.metadata["dagster/row_count"].value
        for e in result.get_asset_materialization_events()
    }
    assert counts == dict.fromkeys(ALL_DAYS, 1000)
    assert operations(location) == ["append", "overwrite", "overwrite", "overwrite"]
    assert stored(location) == expected(*[events(d, version=4) for d in ALL_DAYS])


# Types ----------------------------------------------------------------------------------------


def test_a_new_table_stores_icebergs_types_and_later_batches_fit_them(
    location: IcebergLocation,
) -> None:
    day = datetime(2026, 1, 1)
    batch = pa.table(
        {
            "event_id": pa.array([1, 2], pa.uint32()),
            "event_at": pa.array([day, day], pa.timestamp("ns")),
            "small": pa.array([1, 2], pa.int8()),
            "label": pa.array(["a", "b"], pa.large_string()),
            "when": pa.array([day.date(), day.date()], pa.date64()),
        }
    )
    # 23:59:59.999999999 floors to .999999 (stays in the day); rounding would move it out.
    ns = pa.array(
        [int(day.timestamp()) * 10**9 + 86_399_999_999_999, int(day.timestamp()) * 10**9],
        pa.int64(),
    )
    batch = batch.set_column(1, "event_at", ns.cast(pa.timestamp("ns")))
    publish(location, batch, "overwrite", ALL_DAYS[0])
    schema = table_of(location).schema()
    assert [str(f.field_type) for f in schema.fields] == [
        "long",
        "timestamp",
        "int",
        "string",
        "date",
    ]
    with IcebergBackend(location) as backend:
        columns = backend.load(settings("overwrite", EVENTS, table="events"), None, nothing=True)
    assert isinstance(columns, pa.Table) and columns.num_rows == 0
    types = {f.name: f.type for f in columns.schema}
    assert types == {
        "event_id": pa.int64(),
        "event_at": pa.timestamp("us"),
        "small": pa.int32(),
        "label": pa.string(),
        "when": pa.date32(),
    }
    rows = stored(location)
    assert [r[1] for r in rows] == [
        day.replace(hour=23, minute=59, second=59, microsecond=999_999),
        day,
    ]
    # The same batch again fits the table it created: a rerun equals one run.
    before = stored(location)
    publish(location, batch, "overwrite", ALL_DAYS[0])
    assert stored(location) == before


def test_an_opted_in_widening_iceberg_can_make_is_made_in_the_publish(
    location: IcebergLocation,
) -> None:
    narrow = events(ALL_DAYS[0]).set_column(2, "amount", pa.array([1.0] * 1000, pa.float32()))
    publish(location, narrow, "overwrite", ALL_DAYS[0])
    publish(location, events(ALL_DAYS[1]), "overwrite", ALL_DAYS[1], schema_evolution="widen_types")
    assert str(table_of(location).schema().find_field("amount").field_type) == "double"
    assert len(table_of(location).snapshots()) == 2
    assert stored(location) == expected(
        narrow.set_column(2, "amount", pa.array([1.0] * 1000, pa.float64())), events(ALL_DAYS[1])
    )


def test_a_widening_iceberg_cannot_make_is_refused_and_changes_nothing(
    location: IcebergLocation,
) -> None:
    ints = events(ALL_DAYS[0]).set_column(2, "amount", pa.array([1] * 1000, pa.int32()))
    publish(location, ints, "overwrite", ALL_DAYS[0])
    before = stored(location)
    with pytest.raises(ia.SchemaMismatchError) as refused:
        publish(
            location, events(ALL_DAYS[1]), "overwrite", ALL_DAYS[1], schema_evolution="widen_types"
        )
    text = str(refused.value)
    assert "Iceberg changes a column's type in place only from int to long" in text
    assert "Nothing was changed. Fix:" in text
    assert stored(location) == before
    assert len(table_of(location).snapshots()) == 1


# A REST catalog, by URL ------------------------------------------------------------------------


def test_a_rest_catalog_by_url_takes_publishes_and_a_lost_commit_starts_over(
    tmp_path: Path,
) -> None:
    """A lost compare-and-swap is HTTP 409 there: the publish starts over on the new snapshot."""
    backing = IcebergLocation.local(tmp_path / "behind-rest")
    with RestCatalogServer(backing.open()) as server:  # type: ignore[arg-type]
        rest = IcebergLocation(server.uri, backing.warehouse)
        fill(rest)
        tries: list[str] = []

        def another_writer_first(stage: str) -> None:
            if stage == "guards_passed":
                tries.append(stage)
            if stage == "before_commit" and len(tries) == 1:
                publish(rest, events(ALL_DAYS[2], version=8), "overwrite", ALL_DAYS[2])

        with IcebergBackend(rest) as backend:
            ia.publish(
                backend,
                events(ALL_DAYS[1], version=4),
                settings("overwrite", EVENTS, table="events"),
                window(ALL_DAYS[1]),
                now=NOW,
                on_stage=another_writer_first,
            )
        assert len(tries) == 2
        assert stored(rest) == expected(
            events(ALL_DAYS[0]), events(ALL_DAYS[1], version=4), events(ALL_DAYS[2], version=8)
        )


def test_a_key_longer_than_a_file_name_is_stored_and_replaced(location: IcebergLocation) -> None:
    """Iceberg reads partition values from its manifests: no key needs to fit in a path."""
    key = "a long region name " * 16
    regions = dg.StaticPartitionsDefinition([key, "short"])
    meta = settings(
        "overwrite", {"partition_expr": "region"}, table="by_region", partitions_def=regions
    )
    for version in (1, 2):
        batch = pa.table({"region": [key, key], "amount": [version, version + 10]})
        with IcebergBackend(location) as backend:
            ia.publish(
                backend, batch, meta, ia.window_from_keys(regions, [key], "by_region"), now=NOW
            )
    assert stored(location, "by_region") == [(key, 2), (key, 12)]


def test_an_iceberg_store_is_moved_into_each_trial_of_the_rerun_kit(tmp_path: Path) -> None:
    # Each trial gets its own catalog and warehouse: sharing one, the second trial's days would
    # overwrite the first's and the comparison would pass whatever the assets did.
    given = IcebergLocation.local(tmp_path / "given")
    io_manager = ia.IcebergOverwriteIOManager(catalog_uri=given.uri, warehouse=given.warehouse)
    report = assert_rerun_safe(
        [orders, latest_orders],
        resources={"io_manager": io_manager},
        partition_range=RANGE,
        workdir=tmp_path / "trials",
        properties=["rerun", "chunking"],
    )
    assert report.compared == ["orders", "latest_orders"]
    assert not (tmp_path / "given").exists()
    catalogs = sorted(p.parents[1].name for p in (tmp_path / "trials").glob("*/iceberg/catalog.db"))
    assert catalogs == ["baseline", "chunked"]
