"""Streamed batches and streamed inputs: every kind of stream, judged as a whole table is.

The conformance suite runs the replace contract with a streamed batch on every engine
(tests/conformance/test_streams.py); this file covers what does not depend on the engine: each
kind an asset may return or ask for, the checks that read values before staging, the progress
in the run log, and the memory a streamed publish takes.
"""

import hashlib
import json
import re
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import duckdb
import pandas as pd
import polars as pl
import pyarrow as pa
import pytest

import idem_assets as ia
from tests.helpers import DAILY, NOW, doc_python, settings, step_failure, window

from .support import (
    DAYS,
    check_statuses,
    fingerprints,
    frame_rows,
    read,
    resources,
    rows,
    run,
    trips,
    trips_asset,
)

MD: dict[str, Any] = {"partition_expr": "pickup_at", "primary_key": ["trip_id"]}


def day_table(day: str, n: int = 1000) -> pa.Table:
    return pa.Table.from_pandas(trips(day, n), preserve_index=False)


def batches_of(table: pa.Table, size: int = 300) -> Iterator[pa.RecordBatch]:
    yield from table.to_batches(size)


def stream(table: pa.Table) -> pa.RecordBatchReader:
    return pa.RecordBatchReader.from_batches(table.schema, batches_of(table))


#: Each kind of stream an asset may return, made from the day's rows. A generator is returned
#: through ia.batches: a bare one Dagster would take for the step's own stream of events.
FORMS: dict[str, Any] = {
    "RecordBatchReader": stream,
    "generator of RecordBatches": lambda t: ia.batches(batches_of(t)),
    "iterator of Tables": lambda t: iter([t.slice(i, 250) for i in range(0, t.num_rows, 250)]),
    "generator of pandas DataFrames": lambda t: ia.batches(
        t.slice(i, 400).to_pandas() for i in range(0, t.num_rows, 400)
    ),
    "generator of Polars DataFrames": lambda t: ia.batches(
        pl.from_arrow(t.slice(i, 400)) for i in range(0, t.num_rows, 400)
    ),
    "Polars LazyFrame": lambda t: pl.from_arrow(t).lazy().filter(pl.col("fare") >= 0),
    "DuckDB relation": lambda t: duckdb.connect().from_arrow(t),
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_every_kind_of_stream_publishes_and_reruns_to_the_same_rows(
    tmp_path: Path, form: str
) -> None:
    db = tmp_path / "w.duckdb"
    asset = trips_asset(source=lambda context: FORMS[form](day_table(context.partition_key)))
    for _ in range(2):
        result = run([asset], db, DAYS[1])
        assert result.success
    with read(db) as conn:
        assert rows(conn) == frame_rows(trips(DAYS[1]))
    metadata = result.get_asset_materialization_events()[0].materialization.metadata
    assert metadata["dagster/row_count"].value == 1000
    assert metadata["rows_deleted"].value == 1000
    assert [c.name for c in metadata["dagster/column_schema"].value.columns] == [
        "trip_id",
        "pickup_at",
        "passenger_count",
        "fare",
    ]


def test_a_streamed_publish_reports_its_progress_in_the_run_log(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    asset = trips_asset(source=lambda context: stream(day_table(DAYS[1])))
    with dg.instance_for_test() as instance:
        result = run([asset], db, DAYS[1], instance=instance)
        said = [e.user_message for e in instance.all_logs(result.run_id)]
    text = "\n".join(said)
    assert "Staged 1,000 rows" in text
    assert "Every guard passed on the staged batch of asset 'trips', partition 2026-01-02" in text
    assert "Wrote 1,000 rows of asset 'trips', partition 2026-01-02; committing." in text
    assert "Committed asset 'trips', partition 2026-01-02: main.trips holds 1,000 rows" in text


def test_an_iterator_that_yields_nothing_is_refused_with_the_fix(tmp_path: Path) -> None:
    asset = trips_asset(source=lambda context: iter([]))
    result = run([asset], tmp_path / "w.duckdb", DAYS[1], raise_on_error=False)
    assert not result.success
    text = step_failure(result)
    assert "returned an iterator that yielded no batch" in text
    assert "Nothing was changed. Fix: yield one empty batch with the columns" in text


def test_a_later_batch_with_other_columns_is_refused_and_nothing_changes(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    run([trips_asset()], db, DAYS[1])
    before = fingerprints(db)

    def drifting(context: dg.AssetExecutionContext) -> Iterator[pa.Table]:
        day = day_table(context.partition_key)
        renamed = day.slice(500).rename_columns(["trip_id", "pickup_at", "passengers", "fare"])
        return iter([day.slice(0, 500), renamed])

    result = run([trips_asset(source=drifting)], db, DAYS[1], raise_on_error=False)
    text = step_failure(result)
    assert "batch 2 of the iterator it returned has columns [trip_id int64" in text
    assert "Nothing was changed. Fix: give every yielded batch the first one's columns" in text
    assert fingerprints(db) == before


def test_a_relation_of_a_closed_connection_is_refused_with_the_fix(tmp_path: Path) -> None:
    def closed(context: dg.AssetExecutionContext) -> duckdb.DuckDBPyRelation:
        conn = duckdb.connect()
        relation = conn.from_arrow(day_table(context.partition_key))
        conn.close()
        return relation

    result = run([trips_asset(source=closed)], tmp_path / "w.duckdb", DAYS[1], raise_on_error=False)
    text = step_failure(result)
    assert "returned a DuckDB relation whose connection is closed" in text
    assert "Fix: build the relation on a connection the asset does not close" in text


def test_a_random_uuid_deep_in_a_stream_is_found_as_in_a_table(tmp_path: Path) -> None:
    """The run-time check reads a probe of the staged copy that holds what it looks for."""
    day = day_table(DAYS[1])
    ids = [f"trip-{i}" for i in range(999)] + [str(uuid.uuid4())]
    batch = day.append_column("ref", pa.array(ids))
    with duckdb.connect(str(tmp_path / "w.duckdb")) as conn, pytest.raises(ia.RuntimeValueError):
        ia.publish(
            conn,
            stream(batch),
            settings("overwrite", MD),
            window(DAYS[1]),
            now=NOW,
        )
        pytest.fail("a uuid4 in the last row was not found")


def test_a_load_stamp_in_a_stream_is_found_as_in_a_table(tmp_path: Path) -> None:
    day = day_table(DAYS[1])
    stamped = day.append_column(
        "loaded_at", pa.array([NOW.replace(tzinfo=None) - timedelta(seconds=1)] * 1000)
    )
    with duckdb.connect(str(tmp_path / "w.duckdb")) as conn:
        with pytest.raises(ia.RuntimeValueError, match="'loaded_at'"):
            ia.publish(
                conn,
                stream(stamped),
                settings("overwrite", MD),
                window(DAYS[1]),
                now=NOW,
            )
        # A source's own timestamps, spread over the day, are not one.
        ia.publish(
            conn,
            stream(day),
            settings("overwrite", MD),
            window(DAYS[1]),
            now=NOW,
        )


def test_a_lossy_value_in_a_later_batch_is_counted_over_the_whole_stream(tmp_path: Path) -> None:
    """A checked conversion reads every staged row, a chunk at a time, and counts them all."""
    floats = {"partition_expr": "pickup_at"}
    first = day_table(DAYS[1]).set_column(3, "fare", pa.array([1.5] * 1000))
    n = 300_000
    # Exact in a DOUBLE but for the last two, past the 53 bits of its mantissa.
    fares = [*range(n - 2), 2**53 + 1, 2**53 + 3]
    wide = pa.table(
        {
            "trip_id": pa.array(range(n), pa.int64()),
            "pickup_at": pa.array(
                [datetime(2026, 1, 2) + timedelta(seconds=i % 80_000) for i in range(n)],
                pa.timestamp("us"),
            ),
            "passenger_count": pa.array([1] * n, pa.int64()),
            "fare": pa.array(fares, pa.int64()),
        }
    )
    with duckdb.connect(str(tmp_path / "w.duckdb")) as conn:
        write = settings("overwrite", floats)
        ia.publish(conn, first, write, window(DAYS[1]), now=NOW)
        with pytest.raises(ia.SchemaMismatchError) as refused:
            ia.publish(conn, stream(wide), write, window(DAYS[1]), now=NOW)
    text = str(refused.value)
    assert "2 value(s) of 'fare' (BIGINT) are not exactly representable as DOUBLE" in text
    assert "e.g. [9007199254740993, 9007199254740995]" in text


@pytest.mark.parametrize("kind", ["RecordBatchReader", "LazyFrame", "DuckDBPyRelation"])
def test_a_streamed_input_gets_the_window_in_partition_order(tmp_path: Path, kind: str) -> None:
    db = tmp_path / "w.duckdb"
    frame_type = {
        "RecordBatchReader": pa.RecordBatchReader,
        "LazyFrame": pl.LazyFrame,
        "DuckDBPyRelation": duckdb.DuckDBPyRelation,
    }[kind]
    seen: dict[str, Any] = {}

    @dg.asset(partitions_def=DAILY, metadata={"partition_expr": "pickup_at"})
    def trips_up(context: dg.AssetExecutionContext) -> pd.DataFrame:
        # Stored out of order: the load's order is the partition column's.
        return trips(context.partition_key).iloc[::-1]

    @dg.asset(partitions_def=DAILY, metadata={"partition_expr": "pickup_at", "allow_empty": True})
    def busy(trips_up: frame_type) -> Any:  # type: ignore[valid-type]
        seen["type"] = type(trips_up)
        if kind == "LazyFrame":
            seen["stamps"] = trips_up.collect()["pickup_at"].to_list()
            return trips_up.filter(pl.col("passenger_count") >= 4)
        if kind == "DuckDBPyRelation":
            seen["stamps"] = trips_up.to_arrow_table().column("pickup_at").to_pylist()
            return trips_up.filter("passenger_count >= 4")
        table = trips_up.read_all()
        seen["stamps"] = table.column("pickup_at").to_pylist()
        return table.filter(pa.compute.greater_equal(table["passenger_count"], 4))

    for _ in range(2):
        run([trips_up, busy], db, DAYS[1])
    assert issubclass(seen["type"], frame_type)
    with read(db) as conn:
        stored = rows(conn, "busy")
    assert stored == frame_rows(trips(DAYS[1]).query("passenger_count >= 4"))
    assert seen["stamps"] == sorted(seen["stamps"]) and len(seen["stamps"]) == 1000


def test_staging_memory_must_be_a_size(tmp_path: Path) -> None:
    asset = trips_asset(source=lambda context: stream(day_table(DAYS[1])))
    bad = {**resources(tmp_path / "w.duckdb")}
    bad["io_manager"] = ia.DuckDBOverwriteIOManager(
        database=str(tmp_path / "w.duckdb"), staging_memory="a lot"
    )
    result = dg.materialize([asset], resources=bad, partition_key=DAYS[1], raise_on_error=False)
    assert (
        "staging_memory 'a lot' is not a memory size of at least 16MB. Fix: a number and a unit"
        in step_failure(result)
    )


def limit(conn: duckdb.DuckDBPyConnection) -> str:
    """The database's memory limit as DuckDB shows it."""
    return conn.execute("SELECT current_setting('memory_limit')").fetchall()[0][0]


def test_the_target_database_keeps_its_own_memory_limit(tmp_path: Path) -> None:
    """A streamed publish limits the target's DuckDB while it runs, then puts its limit back."""
    write = settings("overwrite", MD)

    with duckdb.connect(str(tmp_path / "w.duckdb")) as conn:
        default = limit(conn)
        seen: list[str] = []
        hook = lambda stage: seen.append(limit(conn))  # noqa: E731
        ia.publish(conn, stream(day_table(DAYS[1])), write, window(DAYS[1]), now=NOW, on_stage=hook)
        assert set(seen) == {"244.1 MiB"} and limit(conn) == default
        conn.execute("SET memory_limit = '3GB'")
        shown = limit(conn)
        ia.publish(conn, stream(day_table(DAYS[1])), write, window(DAYS[1]), now=NOW)
        # Set by hand, it comes back to within what DuckDB shows of it (one decimal).
        assert limit(conn) == shown


@pytest.mark.parametrize("size", ["1000000000", "1PB", "1 PiB", "1IB"])
def test_a_size_duckdb_would_refuse_is_refused_before_the_limit_moves(size: str) -> None:
    """DuckDB takes no bare number nor peta-units: refused first, the next publish unharmed."""
    from idem_assets.lib.write.streams import _LIMITS

    write = settings("overwrite", MD)
    with duckdb.connect() as conn:
        conn.execute("SET memory_limit = '3GB'")
        shown = limit(conn)
        with pytest.raises(ia.ConfigurationError, match=r"a unit \(B, KB, MB, GB, TB, KiB"):
            ia.publish(conn, stream(day_us(DAYS[1])), write, window(DAYS[1]), now=NOW, memory=size)
        assert limit(conn) == shown
        assert not _LIMITS
        ia.publish(conn, stream(day_us(DAYS[1])), write, window(DAYS[1]), now=NOW)
        assert rows(conn) == frame_rows(trips(DAYS[1]))


def test_a_limit_duckdb_cannot_take_changes_nothing_and_says_the_fix() -> None:
    """A database in memory with no temporary directory cannot shrink below what it holds."""
    from idem_assets.lib.write.streams import _LIMITS

    write = settings("overwrite", MD)
    with duckdb.connect() as conn:
        conn.execute("SET temp_directory = ''")
        ia.publish(conn, day_us(DAYS[1]), write, window(DAYS[1]), now=NOW)
        conn.execute("CREATE TABLE ballast AS SELECT range::VARCHAR AS v FROM range(3000000)")
        conn.execute("SET memory_limit = '3GB'")
        shown = limit(conn)
        with pytest.raises(duckdb.OutOfMemoryException) as raised:
            ia.publish(
                conn, stream(day_us(DAYS[1], 700)), write, window(DAYS[1]), now=NOW, memory="32MB"
            )
        notes = " ".join(raised.value.__notes__)
        assert "Nothing was staged or changed. Fix: raise staging_memory" in notes
        assert limit(conn) == shown
        assert not _LIMITS and rows(conn) == frame_rows(trips(DAYS[1]))
        # The fix as printed: a staging_memory above what the database holds.
        again = stream(day_us(DAYS[1], 700))
        ia.publish(conn, again, write, window(DAYS[1]), now=NOW, memory="1GB")
        assert rows(conn) == frame_rows(trips(DAYS[1], 700))


#: A child measures one publish's peak memory: ``python -m tests.lib.stream_memory <args>``.
MEMORY_WORKER = "tests.lib.stream_memory"


def measured(tmp_path: Path, how: str, rows: int) -> dict[str, Any]:
    found = subprocess.run(
        [sys.executable, "-m", MEMORY_WORKER, str(tmp_path / f"{how}.duckdb"), how, str(rows)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return json.loads(found.stdout.splitlines()[-1])


def test_a_streamed_publish_takes_less_memory_than_its_batch(tmp_path: Path) -> None:
    """A batch of 180 MB as Arrow, published streamed under a 64 MB staging limit.

    Measured in fresh processes: the streamed publish's peak memory rises by far less than the
    batch, and it stores every row; the same rows published as one Arrow table raise it by
    more than the batch itself.
    """
    rows = 5_000_000
    streamed = measured(tmp_path, "stream", rows)
    whole = measured(tmp_path, "table", rows)
    assert streamed["stored"] == whole["stored"] == rows
    assert streamed["fingerprint"] == whole["fingerprint"]
    batch = streamed["batch_bytes"]
    assert batch == 180_000_000
    assert whole["peak_increase"] > batch
    assert streamed["peak_increase"] < batch / 2, streamed


def audited_stream(checks: list[ia.Check], source: Any, metadata: dict[str, Any]) -> Any:
    """A daily audited asset whose batch is a stream of ``source``'s rows."""

    @ia.audited_asset(checks=checks, partitions_def=DAILY, metadata=metadata)
    def trips(context: dg.AssetExecutionContext) -> Any:
        """Trips, audited as a stream before they are published."""
        return stream(source(context))

    return trips


def test_an_audited_stream_is_checked_on_its_staged_copy_then_published(tmp_path: Path) -> None:
    """The blocking checks read the stream's staged copy; the IO manager publishes that copy."""
    db = tmp_path / "w.duckdb"
    checks = [ia.row_count(min_rows=1), ia.unique("trip_id"), ia.not_null("fare")]
    md = {"partition_expr": "pickup_at"}
    good = audited_stream(checks, lambda c: day_table(c.partition_key), md)
    with dg.instance_for_test() as instance:
        for _ in range(2):
            result = run([good], db, DAYS[1], instance=instance)
        assert check_statuses(instance, "trips", "trip_id_unique") == {DAYS[1]: "SUCCEEDED"}
    assert result.success
    with read(db) as conn:
        assert rows(conn) == frame_rows(trips(DAYS[1]))
        before = rows(conn)

    def with_duplicates(context: dg.AssetExecutionContext) -> pa.Table:
        day = day_table(context.partition_key)
        return pa.concat_tables([day, day.slice(0, 3)])

    bad = audited_stream(checks, with_duplicates, md)
    refused = run([bad], db, DAYS[1], raise_on_error=False)
    assert not refused.success
    assert "BlockingCheckError" in step_failure(refused)
    with read(db) as conn:
        assert rows(conn) == before


def test_an_audited_stream_keeps_the_latest_row_per_key(tmp_path: Path) -> None:
    """dedupe_order_by on an audited stream: the staged copy is deduplicated, then published."""
    db = tmp_path / "w.duckdb"
    md = {"partition_expr": "pickup_at", "primary_key": ["trip_id"], "dedupe_order_by": ["fare"]}

    def twice(context: dg.AssetExecutionContext) -> pa.Table:
        day = day_table(context.partition_key)
        dearer = day.slice(0, 5).set_column(3, "fare", pa.array([999.0] * 5))
        return pa.concat_tables([day, dearer])

    asset = audited_stream([ia.unique("trip_id")], twice, md)
    assert run([asset], db, DAYS[1]).success
    with read(db) as conn:
        stored = rows(conn)
    assert len(stored) == 1000
    assert sorted(r[3] for r in stored)[-5:] == [999.0] * 5


def test_a_streamed_batch_plans_as_a_table_does(tmp_path: Path) -> None:
    """A rerun plan stages a stream as the publish does: the same counts, nothing written."""
    write = settings("overwrite", MD)
    day = day_table(DAYS[1])
    corrected = day.slice(5).set_column(3, "fare", pa.array([7.0] * 995))
    # The rows whose fare was 7.0 already are unchanged; every other row is replaced.
    same = sum(1 for fare in day.column("fare").to_pylist()[5:] if fare == 7.0)
    with duckdb.connect(str(tmp_path / "w.duckdb")) as conn:
        ia.publish(conn, day, write, window(DAYS[1]), now=NOW)
        before = ia.table_fingerprint(conn, "main", "trips")
        whole = ia.plan(conn, corrected, write, window(DAYS[1]), now=NOW)
        streamed = ia.plan(conn, stream(corrected), write, window(DAYS[1]), now=NOW)
        assert ia.table_fingerprint(conn, "main", "trips") == before
    assert streamed.total == whole.total
    total = streamed.total
    assert (total.unchanged, total.inserted, total.deleted) == (same, 995 - same, 1000 - same)


def test_the_streaming_page_example_runs_as_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/streaming.md: each table holds the day's 10,000 rows once; a stray row is refused."""
    monkeypatch.chdir(tmp_path)
    code = doc_python("## An asset that streams", "docs/streaming.md")
    namespace: dict[str, Any] = {}
    exec(compile(code, "docs/streaming.md", "exec"), namespace)
    defs: dg.Definitions = namespace["defs"]
    job = defs.resolve_implicit_global_asset_job_def()
    for _ in range(2):
        assert job.execute_in_process(partition_key=DAYS[1]).success
    with duckdb.connect("warehouse.duckdb") as conn:
        for table in ("trips", "dear_trips"):
            days = conn.execute(
                f"SELECT count(*), count(DISTINCT trip_id), min(pickup_at)::DATE,"
                f" max(pickup_at)::DATE FROM main.{table}"
            ).fetchall()
            assert days == [(10_000, 10_000, date(2026, 1, 2), date(2026, 1, 2))]
        before = conn.execute("SELECT count(*) FROM main.trips").fetchall()
    pages = namespace["pages"]

    def with_a_stray_row(day: str) -> Iterator[pa.RecordBatch]:
        yield from pages(day)
        yield next(iter(pages("2026-01-03"))).slice(0, 1)

    namespace["pages"] = with_a_stray_row
    result = job.execute_in_process(partition_key=DAYS[1], raise_on_error=False)
    assert "StrayRowsError" in step_failure(result)
    with duckdb.connect("warehouse.duckdb") as conn:
        assert conn.execute("SELECT count(*) FROM main.trips").fetchall() == before


def test_a_failure_of_duckdb_while_staging_is_reported_as_itself(tmp_path: Path) -> None:
    """Past the memory limit with no room to spill, DuckDB's own error says so: nothing changed."""
    write = settings("overwrite", MD)
    with duckdb.connect(str(tmp_path / "w.duckdb")) as conn:
        ia.publish(conn, day_table(DAYS[1]), write, window(DAYS[1]), now=NOW)
        before = rows(conn)
        conn.execute("SET max_temp_directory_size = '1MB'")
        big = pa.Table.from_pandas(trips(DAYS[1], 1000), preserve_index=False)
        many = pa.concat_tables([big] * 400)
        with pytest.raises(duckdb.Error) as failed:
            ia.publish(conn, stream(many), write, window(DAYS[1]), now=NOW, memory="16MB")
        assert not isinstance(failed.value, GeneratorExit)
        conn.execute("RESET max_temp_directory_size")
        assert rows(conn) == before


def test_memory_limits_of_overlapping_publishes_come_back_as_they_were() -> None:
    """Two publishes staging at once on one database: the larger limit holds, then the own."""
    from idem_assets.lib.write.streams import memory_limited

    conn = duckdb.connect()

    default = limit(conn)
    first, second = memory_limited(conn, "64MB"), memory_limited(conn, "128MB")
    first.__enter__()
    assert limit(conn) == "61.0 MiB"
    second.__enter__()
    assert limit(conn) == "122.0 MiB"
    first.__exit__(None, None, None)
    assert limit(conn) == "122.0 MiB"
    second.__exit__(None, None, None)
    assert limit(conn) == default
    conn.execute("SET memory_limit = '-1'")
    with memory_limited(conn, "64MB"):
        assert limit(conn) == "61.0 MiB"
    assert limit(conn) == "16383.9 PiB"


def test_a_publish_lends_its_share_of_the_limit_and_takes_it_back() -> None:
    """While one publish's engine writes, its share is cut; the others keep what they asked."""
    from idem_assets.lib.write.streams import memory_lent, memory_limited

    conn = duckdb.connect()

    default = limit(conn)
    with memory_limited(conn, "256MB"):
        with memory_lent(conn, "256MB", "32MB"):
            assert limit(conn) == "30.5 MiB"
        assert limit(conn) == "244.1 MiB"
        with memory_limited(conn, "128MB"), memory_lent(conn, "256MB", "32MB"):
            assert limit(conn) == "122.0 MiB"
        assert limit(conn) == "244.1 MiB"
        # A share nobody asked for is not lent.
        with memory_lent(conn, "512MB", "32MB"):
            assert limit(conn) == "244.1 MiB"
    with memory_lent(conn, "256MB", "32MB"):
        assert limit(conn) == default
    assert limit(conn) == default


def test_categories_beyond_a_small_index_survive_the_staged_copy(tmp_path: Path) -> None:
    """Pages of pandas categoricals, each under 128 categories, more than 128 across pages."""

    def pages(context: dg.AssetExecutionContext) -> Iterator[pd.DataFrame]:
        frame = trips(context.partition_key)
        for first in range(0, 1000, 100):
            page = frame.iloc[first : first + 100].copy()
            page["zone"] = pd.Categorical([f"zone-{first + i}" for i in range(100)])
            yield page

    db = tmp_path / "w.duckdb"
    assert run([trips_asset(source=lambda c: ia.batches(pages(c)))], db, DAYS[1]).success
    with read(db) as conn:
        zones = conn.execute("SELECT count(DISTINCT zone) FROM main.trips").fetchall()
    assert zones == [(1000,)]


def test_a_few_hex_ids_pass_streamed_as_they_pass_whole(tmp_path: Path) -> None:
    """Three uuid4().hex values are not yet a run-time column, in a table or in a stream."""
    day = day_table(DAYS[1])
    refs = [f"ref-{i}" for i in range(997)] + [uuid.uuid4().hex for _ in range(3)]
    batch = day.append_column("ref", pa.array(refs))
    write = settings("overwrite", MD)
    with duckdb.connect(str(tmp_path / "w.duckdb")) as conn:
        ia.publish(conn, batch, write, window(DAYS[1]), now=NOW)
        ia.publish(conn, stream(batch), write, window(DAYS[1]), now=NOW)


def _refs(values: list[Any], kind: pa.DataType | None = None) -> pa.Array:
    """A ``ref`` column of a 1,000-row day: ``values`` last, the rows before them plain ids."""
    plain = [f"ref-{i}" for i in range(1000 - len(values))]
    if kind == pa.binary(16):
        plain = [i.to_bytes(16, "big") for i in range(1000 - len(values))]
    column = pa.array(plain + values, kind)
    return column


#: Columns the run-time check refuses or passes whole; a stream is judged on its probe alone.
REFS: dict[str, pa.Array] = {
    "canonical uuid4": _refs([str(uuid.uuid4())]),
    "braced upper case": _refs(["{" + str(uuid.uuid4()).upper() + "}"]),
    "uuid1": _refs([str(uuid.uuid1())]),
    "uuid4 hex": _refs([uuid.uuid4().hex for _ in range(200)]),
    "uuid4 hex and one md5": _refs(
        [uuid.uuid4().hex for _ in range(200)] + [hashlib.md5(b"trip").hexdigest()]
    ),
    "uuid5": _refs([str(uuid.uuid5(uuid.NAMESPACE_URL, str(i))) for i in range(200)]),
    "uuid4 bytes": _refs([uuid.uuid4().bytes for _ in range(200)], pa.binary(16)),
    "uuid5 bytes": _refs(
        [uuid.uuid5(uuid.NAMESPACE_URL, str(i)).bytes for i in range(200)], pa.binary(16)
    ),
    "dictionary of uuid4": pa.array(
        [f"ref-{i}" for i in range(999)] + [str(uuid.uuid4())]
    ).dictionary_encode(),
    "large string uuid4": _refs([str(uuid.uuid4())], pa.large_string()),
}


@pytest.mark.parametrize("refs", REFS.values(), ids=REFS.keys())
def test_a_stream_gets_the_run_time_verdict_its_table_gets(tmp_path: Path, refs: pa.Array) -> None:
    """One scan of the staged copy picks what the check reads, in every spelling and type.

    The refusal's example may be another of the column's values.
    """
    batch = day_table(DAYS[1]).append_column("ref", refs)
    values = {v.hex() if isinstance(v, bytes) else v for v in refs.to_pylist()}
    verdicts = []
    for form, data in (("table", batch), ("stream", stream(batch))):
        with duckdb.connect(str(tmp_path / f"{form}.duckdb")) as conn:
            try:
                ia.publish(conn, data, settings("overwrite", MD), window(DAYS[1]), now=NOW)
                verdicts.append("published")
            except ia.RuntimeValueError as error:
                example = re.search(r"e\.g\. '([^']*)'", str(error))
                assert example is not None and example.group(1) in values, str(error)
                verdicts.append(str(error).replace(example.group(1), "..."))
    assert verdicts[0] == verdicts[1]


def test_a_stream_naming_a_column_twice_is_refused_before_staging(tmp_path: Path) -> None:
    day = day_table(DAYS[1]).append_column("Fare", pa.array([1.0] * 1000))
    with duckdb.connect(str(tmp_path / "w.duckdb")) as conn:
        with pytest.raises(ia.SchemaMismatchError, match=r"more than one column named \['Fare'"):
            ia.publish(conn, stream(day), settings("overwrite", MD), window(DAYS[1]), now=NOW)


def test_a_relation_of_the_target_connection_is_refused_with_a_fix_that_works(
    tmp_path: Path,
) -> None:
    write = settings("overwrite", MD)
    with duckdb.connect(str(tmp_path / "w.duckdb")) as conn:
        conn.register("landed", day_table(DAYS[1]))
        conn.execute("CREATE TABLE main.landing AS SELECT * FROM landed")
        with pytest.raises(ia.SchemaMismatchError, match=r"conn.cursor\(\).sql\(\.\.\.\)"):
            ia.publish(
                conn, conn.sql("SELECT * FROM main.landing"), write, window(DAYS[1]), now=NOW
            )
        ia.publish(
            conn, conn.cursor().sql("SELECT * FROM main.landing"), write, window(DAYS[1]), now=NOW
        )
        assert rows(conn) == frame_rows(trips(DAYS[1]))


def test_nanosecond_timestamps_are_floored_in_the_copy_a_file_reader_gets(tmp_path: Path) -> None:
    """Spark reads the staged copy as Parquet, which it takes in microseconds only."""
    import pyarrow.parquet as pq

    from idem_assets.lib.write.evaluator import embedded_database
    from idem_assets.lib.write.streams import SpillArea, as_stream, spilled

    stamps = pa.array([-1_500, 1_999, 86_399_999_999_999], pa.timestamp("ns"))
    batch = pa.table({"at": stamps, "n": [1, 2, 3]})
    area = SpillArea(embedded_database(), temporary=False)
    stream_of = as_stream(stream(batch), "test")
    assert stream_of is not None
    with spilled(stream_of, area) as staged:
        written = pq.read_table(staged.parquet())
    assert written.schema.field("at").type == pa.timestamp("us")
    assert written.column("at").cast(pa.int64()).to_pylist() == [-2, 1, 86_399_999_999]


def _spill_files() -> list[str]:
    from idem_assets.lib.write.streams import SPILL_FILE_PREFIX, spill_root

    return sorted(p.name for p in spill_root().glob(f"{SPILL_FILE_PREFIX}*"))


def _attached(conn: duckdb.DuckDBPyConnection) -> list[str]:
    from idem_assets.lib.write.streams import SPILL_FILE_PREFIX

    found = conn.execute("SELECT database_name FROM duckdb_databases()").fetchall()
    return [name for (name,) in found if name.startswith(SPILL_FILE_PREFIX)]


@pytest.mark.parametrize(("copies", "files"), [(1, True), (400, True), (400, False)])
def test_a_stream_outgrowing_half_the_limit_moves_to_a_file_removed_after(
    copies: int, files: bool
) -> None:
    """Held in memory while small; past half the limit in a DuckDB file, deleted at the end.

    Only in an area that stages in files; elsewhere DuckDB evicts the table as it grows.
    """
    from idem_assets.lib.write.evaluator import embedded_database
    from idem_assets.lib.write.streams import SpillArea, as_stream, spilled

    day = pa.concat_tables([day_table(DAYS[1])] * copies).combine_chunks()
    # 16MB, the least a limit may be: the 400 copies (about 16 MB as Arrow) outgrow 8 MB.
    outgrows = day.nbytes > 8 * 10**6
    assert outgrows == (copies == 400)
    source = as_stream(stream(day), "test")
    assert source is not None
    area = SpillArea(embedded_database(), temporary=False, files=files)
    with spilled(source, area, memory="16MB") as staged:
        assert (staged.file is not None) == (outgrows and files)
        files = _spill_files()
        if staged.file is not None:
            # With its write-ahead log while the rows are small enough to sit there.
            assert {name.split(".")[0] for name in files} == {staged.file.alias}
            assert _attached(area.conn) == [staged.file.alias]
        else:
            assert (files, _attached(area.conn)) == ([], [])
        # Every row, in the stream's order: the first batches, then the rest after the move.
        assert staged.reader().read_all().equals(day)
    assert (_spill_files(), _attached(area.conn)) == ([], [])


def test_a_publish_staged_in_a_file_leaves_none_behind(tmp_path: Path) -> None:
    """Written from the file, or refused with nothing changed: no file or database remains."""
    day = pa.concat_tables([day_table(DAYS[1])] * 400)
    write = settings("overwrite", MD)
    with duckdb.connect(str(tmp_path / "w.duckdb")) as conn:
        ia.publish(conn, stream(day), write, window(DAYS[1]), now=NOW, memory="16MB")
        assert rows(conn) == sorted(frame_rows(trips(DAYS[1])) * 400)
        with pytest.raises(ia.StrayRowsError):
            ia.publish(conn, stream(day), write, window(DAYS[2]), now=NOW, memory="16MB")
        assert rows(conn) == sorted(frame_rows(trips(DAYS[1])) * 400)
        assert (_spill_files(), _attached(conn)) == ([], [])


def _staged(conn: duckdb.DuckDBPyConnection, batch: Any, write: Any, day: str, **kw: Any) -> str:
    """Publish ``batch`` over ``day``: where its progress says it was staged."""
    said: list[str] = []
    ia.publish(conn, batch, write, window(day), now=NOW, progress=said.append, **kw)
    return next(message for message in said if message.startswith("Staged "))


def day_us(day: str, n: int = 1000) -> pa.Table:
    """The day's trips with microsecond times, as DuckDB stores them (pandas gives nanoseconds)."""
    table = day_table(day, n)
    return table.set_column(1, "pickup_at", table.column("pickup_at").cast(pa.timestamp("us")))


def staged_apart(conn: duckdb.DuckDBPyConnection, batch: pa.Table, write: Any) -> None:
    """Publish ``batch`` streamed over the day: it must be staged apart, in memory."""
    staged = _staged(conn, stream(batch), write, DAYS[1], memory="16MB")
    assert staged.endswith("(DuckDB, 16MB, in memory)."), staged


IN_ITS_TABLE = r'Staged 700 rows in \d+\.\d s \(DuckDB, 16MB, in "main"\."trips" itself\)\.'


def test_a_streamed_day_over_its_table_is_written_once_into_it(tmp_path: Path) -> None:
    """Inserted into the table inside the transaction, judged there: no copy, no file."""
    write = settings("overwrite", MD)
    with duckdb.connect(str(tmp_path / "w.duckdb")) as conn:
        # A table to create is staged apart; once it exists, a day is staged in it.
        assert "itself" not in _staged(conn, stream(day_us(DAYS[1])), write, DAYS[1])
        ia.publish(conn, day_us(DAYS[2]), write, window(DAYS[2]), now=NOW)
        again = _staged(conn, stream(day_us(DAYS[1], 700)), write, DAYS[1], memory="16MB")
        assert re.fullmatch(IN_ITS_TABLE, again), again
        assert rows(conn) == sorted(frame_rows(trips(DAYS[1], 700)) + frame_rows(trips(DAYS[2])))
        assert (_spill_files(), _attached(conn)) == ([], [])


def test_a_day_staged_in_its_table_holds_half_the_limit_and_gives_it_back(tmp_path: Path) -> None:
    """Its rows are on disk as they go in: DuckDB may cache half the limit of them, not all."""
    write = settings("overwrite", MD)

    with duckdb.connect(str(tmp_path / "w.duckdb")) as conn:
        default = limit(conn)
        ia.publish(conn, day_us(DAYS[1]), write, window(DAYS[1]), now=NOW)
        seen: list[str] = []
        hook = lambda stage: seen.append(limit(conn))  # noqa: E731
        said = _staged(conn, stream(day_us(DAYS[1], 700)), write, DAYS[1], on_stage=hook)
        assert "itself" in said and set(seen) == {"122.0 MiB"}, (said, seen)
        assert limit(conn) == default
        with pytest.raises(ia.StrayRowsError):
            ia.publish(conn, stream(day_us(DAYS[2])), write, window(DAYS[1]), now=NOW)
        assert limit(conn) == default
        assert rows(conn) == frame_rows(trips(DAYS[1], 700))
    # A database in memory keeps the whole limit: its table's blocks are not on any disk.
    with duckdb.connect() as conn:
        ia.publish(conn, day_us(DAYS[1]), write, window(DAYS[1]), now=NOW)
        seen.clear()
        said = _staged(conn, stream(day_us(DAYS[1], 700)), write, DAYS[1], on_stage=hook)
        assert "itself" in said and set(seen) == {"244.1 MiB"}, (said, seen)


def test_two_threads_staging_in_their_tables_leave_the_limit_as_it_was(tmp_path: Path) -> None:
    """Two publishes of one database at once, both lending half of the same limit."""
    from idem_assets.lib.write.streams import _LIMITS

    tables = ["trips", "other"]

    with duckdb.connect(str(tmp_path / "w.duckdb")) as conn:
        conn.execute("SET memory_limit = '3GB'")
        shown = limit(conn)
        for table in tables:
            write = settings("overwrite", MD, table=table)
            ia.publish(conn, day_us(DAYS[1]), write, window(DAYS[1]), now=NOW)
        both = threading.Barrier(2)
        seen: list[str] = []
        failed: list[BaseException] = []

        def publish(table: str) -> None:
            cursor = conn.cursor()

            def meet(stage: str) -> None:
                # Read while both stand at the same stage: neither has given its share back.
                both.wait(30)
                seen.append(limit(cursor))
                both.wait(30)

            try:
                for n in (700, 800, 900):
                    write = settings("overwrite", MD, table=table)
                    ia.publish(
                        cursor,
                        stream(day_us(DAYS[1], n)),
                        write,
                        window(DAYS[1]),
                        now=NOW,
                        on_stage=meet,
                    )
            except BaseException as exc:
                failed.append(exc)
                both.abort()

        threads = [threading.Thread(target=publish, args=(t,)) for t in tables]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not failed, failed
        assert set(seen) == {"122.0 MiB"}, set(seen)
        assert limit(conn) == shown and not _LIMITS
        for table in tables:
            stored = conn.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0]
            assert stored == 900


@pytest.mark.parametrize("delete_missing", [True, False])
def test_a_streamed_merge_in_its_table_updates_inserts_and_deletes_stale_rows(
    tmp_path: Path, delete_missing: bool
) -> None:
    """The batch's keys replace their old rows; the window's others go, unless kept."""
    write = settings("merge", {**MD, "delete_missing": delete_missing})
    with duckdb.connect(str(tmp_path / "w.duckdb")) as conn:
        ia.publish(conn, day_us(DAYS[1], 600), write, window(DAYS[1]), now=NOW)
        later = day_us(DAYS[1], 1000).slice(300)
        changed = later.set_column(3, "fare", pa.compute.add(later.column("fare"), 1.0))
        assert re.fullmatch(
            IN_ITS_TABLE, _staged(conn, stream(changed), write, DAYS[1], memory="16MB")
        )
        kept = [] if delete_missing else frame_rows(trips(DAYS[1], 300))
        assert rows(conn) == sorted(kept + [tuple(r.values()) for r in changed.to_pylist()])


def test_a_stream_duckdb_would_cast_is_staged_apart_and_stored_as_a_table_is(
    tmp_path: Path,
) -> None:
    """Its values are checked against the stored types before anything is inserted."""
    write = settings("overwrite", MD)
    day = day_us(DAYS[1])
    narrow = day.set_column(2, "passenger_count", day.column("passenger_count").cast(pa.int32()))
    with duckdb.connect(str(tmp_path / "w.duckdb")) as conn:
        ia.publish(conn, day, write, window(DAYS[1]), now=NOW)
        staged_apart(conn, narrow, write)
        assert rows(conn) == frame_rows(trips(DAYS[1]))


def test_a_duckdb_numbering_new_rows_otherwise_stages_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each process first asks DuckDB how it numbers new rows; otherwise the copy is staged."""
    from idem_assets.lib.backends.duckdb import backend

    write = settings("overwrite", MD)
    with duckdb.connect(str(tmp_path / "w.duckdb")) as conn:
        ia.publish(conn, day_us(DAYS[1]), write, window(DAYS[1]), now=NOW)
        monkeypatch.setattr(backend, "FIRST_NEW_ROWID", 2**62)
        staged_apart(conn, day_us(DAYS[1], 700), write)
        assert rows(conn) == frame_rows(trips(DAYS[1], 700))


def test_new_rows_numbered_otherwise_than_asked_are_refused_with_a_fix_that_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checked around every insert too: nothing is changed, and the printed fix publishes."""
    from idem_assets.lib.backends.duckdb import backend

    write = settings("overwrite", MD)
    with duckdb.connect(str(tmp_path / "w.duckdb")) as conn:
        ia.publish(conn, day_us(DAYS[1]), write, window(DAYS[1]), now=NOW)
        before = rows(conn)
        monkeypatch.setattr(backend, "FIRST_NEW_ROWID", 2**62)
        monkeypatch.setattr(backend, "numbers_new_rows", lambda first: True)
        reader = stream(day_us(DAYS[1], 700))
        with pytest.raises(RuntimeError, match="Nothing was changed") as refused:
            ia.publish(conn, reader, write, window(DAYS[1]), now=NOW)
        assert rows(conn) == before
        assert "Fix: return the batch as a pyarrow Table (reader.read_all())" in str(refused.value)
        reader = stream(day_us(DAYS[1], 700))
        ia.publish(conn, reader.read_all(), write, window(DAYS[1]), now=NOW)
        assert rows(conn) == frame_rows(trips(DAYS[1], 700))


def _primary_key(conn: duckdb.DuckDBPyConnection, day: pa.Table) -> pa.Table:
    conn.execute("ALTER TABLE main.trips ADD PRIMARY KEY (trip_id)")
    return day


def _unique_index(conn: duckdb.DuckDBPyConnection, day: pa.Table) -> pa.Table:
    conn.execute("CREATE UNIQUE INDEX trips_id ON main.trips (trip_id)")
    return day


def _not_null(conn: duckdb.DuckDBPyConnection, day: pa.Table) -> pa.Table:
    conn.execute("ALTER TABLE main.trips ALTER COLUMN fare SET NOT NULL")
    return day


def _other_case(conn: duckdb.DuckDBPyConnection, day: pa.Table) -> pa.Table:
    return day.rename_columns(["trip_id", "pickup_at", "passenger_count", "Fare"])


def _column_named_rowid(conn: duckdb.DuckDBPyConnection, day: pa.Table) -> pa.Table:
    conn.execute("ALTER TABLE main.trips ADD COLUMN rowid BIGINT")
    return day.append_column("rowid", pa.array(range(day.num_rows), pa.int64()))


#: Tables and streams the insert into the table would judge wrongly or fail on before the guards.
APART = {
    "a primary key (a rerun's keys meet the old rows')": _primary_key,
    "a unique index": _unique_index,
    "a NOT NULL column": _not_null,
    "a name in another case": _other_case,
    "a column named rowid": _column_named_rowid,
}


@pytest.mark.parametrize("mode", ["overwrite", "merge"])
@pytest.mark.parametrize("case", sorted(APART))
def test_a_table_or_stream_the_insert_cannot_take_is_staged_apart_and_rerun_as_before(
    tmp_path: Path, case: str, mode: str
) -> None:
    """A rerun of the same keys over a keyed table works, as with a pyarrow Table."""
    write = settings(mode, MD)
    with duckdb.connect(str(tmp_path / "w.duckdb")) as conn:
        ia.publish(conn, day_us(DAYS[1]), write, window(DAYS[1]), now=NOW)
        staged_apart(conn, APART[case](conn, day_us(DAYS[1], 700)), write)
        again = (
            conn.execute("SELECT * EXCLUDE (rowid) FROM main.trips") if "rowid" in case else None
        )
        found = sorted(again.fetchall()) if again is not None else rows(conn)
        assert found == frame_rows(trips(DAYS[1], 700))


def _keeps_order(conn: duckdb.DuckDBPyConnection) -> bool:
    return conn.execute("SELECT current_setting('preserve_insertion_order')").fetchall()[0][0]


@pytest.mark.parametrize("own", [None, False])
def test_the_connection_keeps_its_insertion_order_setting_after_a_publish_in_its_table(
    tmp_path: Path, own: bool | None
) -> None:
    """The insert ignores the stream's order; the setting comes back, after a refusal too."""
    write = settings("overwrite", MD)
    with duckdb.connect(str(tmp_path / "w.duckdb")) as conn:
        ia.publish(conn, day_us(DAYS[1]), write, window(DAYS[1]), now=NOW)
        if own is not None:
            conn.execute(f"SET SESSION preserve_insertion_order = {own}")
        expected = True if own is None else own
        assert re.fullmatch(
            IN_ITS_TABLE, _staged(conn, stream(day_us(DAYS[1], 700)), write, DAYS[1], memory="16MB")
        )
        assert _keeps_order(conn) is expected
        with pytest.raises(ia.StrayRowsError):
            ia.publish(conn, stream(day_us(DAYS[2])), write, window(DAYS[1]), now=NOW)
        assert _keeps_order(conn) is expected
        assert rows(conn) == frame_rows(trips(DAYS[1], 700))
