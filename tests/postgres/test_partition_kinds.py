"""Static and multi-dimensional partitions on PostgreSQL: locks, indexes and bound values."""

from collections.abc import Sequence
from datetime import datetime

import dagster as dg
import pyarrow as pa
import pytest

import idem_assets as ia
from idem_assets.lib.backends.postgres import sql
from idem_assets.lib.backends.postgres.backend import PostgresBackend, PostgresLocation
from idem_assets.lib.model.windows import region_for
from idem_assets.lib.sql import statements
from tests.conformance.test_partition_kinds import (
    BY_DAY_AND_REGION,
    DAYS,
    MULTI,
    ONE_DIM,
    ROWS,
    STATIC,
    sales,
)
from tests.helpers import NOW


def sales_settings(
    partitions_def: dg.PartitionsDefinition, metadata: dict, mode: str = "overwrite"
) -> ia.WriteSettings:
    return ia.resolve_settings(
        asset_key=dg.AssetKey(["sales"]),
        metadata=metadata,
        mode=mode,  # type: ignore[arg-type]
        default_schema="main",
        partitions_def=partitions_def,
    )


def publish_cells(
    backend: PostgresBackend, keys: Sequence[str], version: int = 0, **kwargs: object
) -> ia.PublishResult:
    """Publish the rows of multi keys ``"day|region"`` in one run."""
    batch = pa.concat_tables([sales(*k.split("|"), version) for k in keys])
    window = ia.window_from_keys(MULTI, list(keys), "sales")
    return ia.publish(
        backend, batch, sales_settings(MULTI, BY_DAY_AND_REGION), window, now=NOW, **kwargs
    )


def held_advisory_locks(backend: PostgresBackend, pid: int) -> set[int]:
    """The advisory locks backend ``pid`` holds, as the signed 64-bit keys it locked."""
    backend.cur.execute(
        "SELECT (classid::bigint << 32) | objid::bigint FROM pg_locks"
        " WHERE locktype = 'advisory' AND granted AND pid = $1",
        [pid],
    )
    return {key for (key,) in backend.cur.fetchall()}


def test_a_range_of_cells_locks_each_cell_and_other_cells_write_meanwhile(
    postgres_location: PostgresLocation,
) -> None:
    """Keys such as "2026-01-01|north" lock one by one: a writer of another cell never waits."""
    everything = [f"{d}|{r}" for d in DAYS[:2] for r in ("north", "south")]
    north = [k for k in everything if k.endswith("north")]
    with PostgresBackend.connect(postgres_location) as setup:
        publish_cells(setup, everything)
    seen: dict[str, object] = {}
    with (
        PostgresBackend.connect(postgres_location) as first,
        PostgresBackend.connect(postgres_location) as other,
    ):
        first.cur.execute("SELECT pg_backend_pid()")
        pid = first.cur.fetchall()[0][0]
        # A wait would fail the test instead of hanging it.
        other.cur.execute("SET lock_timeout = '10s'")
        other.conn.commit()

        def meanwhile(stage: str) -> None:
            if stage != "deleted":
                return
            seen["locks"] = held_advisory_locks(other, pid)
            other.conn.rollback()
            seen["south"] = publish_cells(other, [f"{DAYS[0]}|south"], version=2).rows

        publish_cells(first, north, version=1, on_stage=meanwhile)
    assert seen["locks"] == {sql.lock_key("main", "sales", k) for k in north}
    assert seen["south"] == ROWS
    with PostgresBackend.connect(postgres_location) as backend:
        backend.cur.execute(
            "SELECT sold_at::date::text, region, min(amount), count(*) FROM main.sales"
            " GROUP BY 1, 2 ORDER BY 1, 2"
        )
        found = backend.cur.fetchall()
    assert found == [
        (DAYS[0], "north", 1.0, ROWS),
        (DAYS[0], "south", 2.0, ROWS),
        (DAYS[1], "north", 1.0, ROWS),
        (DAYS[1], "south", 0.0, ROWS),
    ]


@pytest.mark.parametrize(
    ("kind", "mode", "expected"),
    [
        ("static", "overwrite", {"btree (region)"}),
        ("multi", "overwrite", {"btree (sold_at, region)"}),
        ("multi", "merge", {"btree (sold_at, region)", "brin (sale_id)"}),
    ],
)
def test_a_new_table_is_indexed_on_its_partition_columns_time_first(
    postgres_location: PostgresLocation, kind: str, mode: str, expected: set[str]
) -> None:
    partitions_def, metadata = (STATIC, ONE_DIM) if kind == "static" else (MULTI, BY_DAY_AND_REGION)
    key = "north" if kind == "static" else f"{DAYS[0]}|north"
    window = ia.window_from_keys(partitions_def, [key], "sales")
    with PostgresBackend.connect(postgres_location) as backend:
        settings = sales_settings(partitions_def, metadata, mode)
        ia.publish(backend, sales(DAYS[0], "north"), settings, window, now=NOW)
        backend.cur.execute("SELECT indexdef FROM pg_indexes WHERE tablename = 'sales'")
        found = {d.split(" USING ")[1].split(" WITH")[0] for (d,) in backend.cur.fetchall()}
    assert found == expected


def test_a_multi_window_is_pushed_down_with_every_value_bound() -> None:
    keys = [f"{DAYS[0]}|north", f"{DAYS[1]}|south"]
    window = ia.window_from_keys(MULTI, keys, "sales")
    types = {"sold_at": pa.timestamp("us"), "region": pa.string()}
    region = region_for(window, (("date", "sold_at"), ("region", "region")), types)
    query, params = statements.select_window(
        ("main", "sales"), None, region, ["sold_at", "region"], dialect="postgres"
    )
    # Not a product of its days and regions: one box per key, so no other cell is read.
    assert query == (
        'SELECT * FROM "main"."sales" WHERE'
        ' ((("sold_at" >= $1 AND "sold_at" < $2) AND "region" IN ($3))'
        ' OR (("sold_at" >= $4 AND "sold_at" < $5) AND "region" IN ($6)))'
        ' ORDER BY "sold_at", "region"'
    )
    day1, day2, day3 = (datetime.fromisoformat(d) for d in DAYS)
    assert params == [day1, day2, "north", day2, day3, "south"]
