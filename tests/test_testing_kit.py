"""idem_assets.testing catches each unsafe pattern in deliberately unsafe assets, passes safe ones.

Every example is a real asset materialised by the kit on DuckDB files under tmp_path. The publish
guards refuse some run-time values themselves, but not a DATE (date.today() looks like any date)
and not what an IO manager without guards writes, which is why a user needs the kit as well.
"""

import json
import tempfile
import urllib.request
import uuid
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import dagster as dg
import duckdb
import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pytest
from dagster_duckdb_pandas import DuckDBPandasIOManager
from pydantic import Field

import idem_assets as ia
from idem_assets.testing import (
    PROPERTIES,
    RerunSafetyError,
    assert_chunking_invariant,
    assert_clock_invariant,
    assert_crash_safe,
    assert_hash_seed_invariant,
    assert_input_order_invariant,
    assert_rerun_idempotent,
    assert_rerun_safe,
)
from tests.helpers import DAILY, doc_python, http_receiver

DAY = "2026-01-02"
RANGE = ("2026-01-01", "2026-01-02")
ORDERS_MD = {"partition_expr": "ordered_at"}


def day_orders(day: date) -> pd.DataFrame:
    """Five orders; order 3 was re-sent with a later updated_at and a corrected amount."""
    start = datetime.combine(day, datetime.min.time())
    base = int(day.strftime("%Y%m%d")) * 10
    ids = [base + i for i in (1, 2, 3, 3, 4, 5)]
    return pd.DataFrame(
        {
            "order_id": ids,
            "ordered_at": [start + timedelta(hours=h) for h in (1, 2, 3, 3, 4, 5)],
            "updated_at": [start + timedelta(hours=h) for h in (1, 2, 3, 9, 4, 5)],
            "amount": [10.0, 20.0, 30.0, 33.0, 40.0, 50.0],
        }
    )


@dg.asset(partitions_def=DAILY, metadata=ORDERS_MD)
def orders(context: dg.AssetExecutionContext) -> pd.DataFrame:
    """Every order delivered for the run's days, re-sent versions included."""
    return pd.concat(
        [day_orders(date.fromisoformat(k)) for k in context.partition_keys], ignore_index=True
    )


def downstream(name: str, fn: Any, io_manager_key: str = "io_manager") -> dg.AssetsDefinition:
    """A daily asset of ``orders`` computed by ``fn(context, orders)``."""
    return dg.asset(
        name=name,
        partitions_def=DAILY,
        metadata=ORDERS_MD,
        ins={"orders": dg.AssetIn()},
        io_manager_key=io_manager_key,
    )(fn)


def latest_sorted(context: dg.AssetExecutionContext, orders: pd.DataFrame) -> pd.DataFrame:
    ordered = orders.sort_values(["order_id", "updated_at"], ascending=[True, False])
    return ordered.drop_duplicates("order_id", keep="first")


def latest_unsorted(context: dg.AssetExecutionContext, orders: pd.DataFrame) -> pd.DataFrame:
    # Keeps whichever copy of a re-sent order happens to arrive first.
    return orders.drop_duplicates("order_id", keep="first")


def stamped_today(context: dg.AssetExecutionContext, orders: pd.DataFrame) -> pd.DataFrame:
    return orders.assign(exported_on=date.today())


def random_ids(context: dg.AssetExecutionContext, orders: pd.DataFrame) -> pd.DataFrame:
    return orders.assign(row_id=[str(uuid.uuid4()) for _ in range(len(orders))])


def numbered(context: dg.AssetExecutionContext, orders: pd.DataFrame) -> pd.DataFrame:
    # Numbers the rows of the whole run: a range run numbers across days.
    ordered = orders.sort_values(["ordered_at", "order_id", "updated_at"])
    return ordered.assign(line=range(1, len(ordered) + 1))


def passthrough(context: dg.AssetExecutionContext, orders: pd.DataFrame) -> pd.DataFrame:
    return orders


def email_totals(
    context: dg.AssetExecutionContext, orders: pd.DataFrame, outbox: ia.Outbox
) -> dg.MaterializeResult:
    # The email's content carries the time it was built, so every run looks like new content.
    body = pa.table({"total": [orders["amount"].sum()], "built_at": [datetime.now().isoformat()]})
    result = outbox.deliver(context, "email_totals", body, lambda delivery: None)
    return dg.MaterializeResult(metadata=result.metadata)


def email_totals_once(
    context: dg.AssetExecutionContext, orders: pd.DataFrame, outbox: ia.Outbox
) -> dg.MaterializeResult:
    body = pa.table({"total": [orders["amount"].sum()]})
    result = outbox.deliver(context, "email_totals", body, lambda delivery: None)
    return dg.MaterializeResult(metadata=result.metadata)


class AppendIOManager(dg.ConfigurableIOManager):
    """A plain INSERT per run, as many hand-written IO managers do; reads the partition back."""

    database: str = Field(description="DuckDB file.")

    @contextmanager
    def _connect(self) -> Iterator[duckdb.DuckDBPyConnection]:
        con = duckdb.connect(self.database)
        try:
            yield con
        finally:
            con.close()

    def handle_output(self, context: dg.OutputContext, obj: pd.DataFrame) -> None:
        table = context.asset_key.path[-1]
        with self._connect() as con:
            con.register("batch", obj)
            con.execute(f"CREATE TABLE IF NOT EXISTS {table} AS SELECT * FROM batch LIMIT 0")
            con.execute(f"INSERT INTO {table} SELECT * FROM batch")

    def load_input(self, context: dg.InputContext) -> pd.DataFrame:
        table = context.asset_key.path[-1]
        window = context.asset_partitions_time_window
        with self._connect() as con:
            return con.execute(
                f"SELECT * FROM {table} WHERE ordered_at >= ? AND ordered_at < ?",
                [window.start.replace(tzinfo=None), window.end.replace(tzinfo=None)],
            ).df()


class DeleteFirstIOManager(ia.DuckDBOverwriteIOManager):
    """Deletes the window in its own autocommit, then publishes: dagster-io/dagster#14091."""

    def handle_output(self, context: dg.OutputContext, obj: pd.DataFrame) -> None:
        window = context.asset_partitions_time_window
        with duckdb.connect(self.database) as con:
            exists = con.execute(
                "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'orders'"
            ).fetchall()[0][0]
            if exists:
                con.execute(
                    "DELETE FROM orders WHERE ordered_at >= ? AND ordered_at < ?",
                    [window.start.replace(tzinfo=None), window.end.replace(tzinfo=None)],
                )
        super().handle_output(context, obj)


def resources() -> dict[str, Any]:
    """The overwrite IO manager; the kit moves its file into each trial's directory."""
    return {"io_manager": ia.DuckDBOverwriteIOManager(database="w.duckdb")}


def duckdb_pandas(directory: Path) -> dict[str, Any]:
    """dagster-duckdb's IO manager: a DELETE and an INSERT per output, no guards."""
    return {"io_manager": DuckDBPandasIOManager(database=str(directory / "w.duckdb"))}


def with_append(directory: Path) -> dict[str, Any]:
    """The append IO manager is not the library's, so the trial's directory is passed in."""
    return {
        "io_manager": ia.DuckDBOverwriteIOManager(database=str(directory / "w.duckdb")),
        "append_io_manager": AppendIOManager(database=str(directory / "append.duckdb")),
    }


#: Module-level, so the hash_seed property's fresh process can import it by name.
latest_orders = downstream("latest_orders", latest_sorted)


@pytest.mark.slow
def test_safe_assets_pass_every_property(tmp_path: Path) -> None:
    report = assert_rerun_safe(
        [orders, latest_orders],
        resources=resources(),
        partition_range=RANGE,
        workdir=tmp_path,
    )
    assert report.properties == list(PROPERTIES)
    assert report.compared == ["orders", "latest_orders"]
    assert report.partitions == ["2026-01-01", "2026-01-02"]
    # Day by day twice, the range twice, reversed inputs, the second clock, the fresh process;
    # 4 crashes per asset.
    assert report.runs == 2 + 2 + 1 + 1 + 2 + 2 + 2 + 4 * 2
    assert (report.skipped, report.unseen) == ({}, [])


def test_an_append_io_manager_fails_the_rerun_with_the_doubled_rows(tmp_path: Path) -> None:
    appended = downstream("orders_appended", passthrough, io_manager_key="append_io_manager")
    with pytest.raises(RerunSafetyError) as caught:
        assert_rerun_idempotent(
            [orders, appended], resources=with_append, partition=DAY, workdir=tmp_path
        )
    err = caught.value
    assert (err.property, err.asset, err.partition) == ("rerun", "orders_appended", DAY)
    assert err.only_first == []
    assert sorted(r["order_id"] for r in err.only_second) == [
        20260102 * 10 + i for i in (1, 2, 3, 3, 4, 5)
    ]
    text = str(err)
    assert text.startswith(
        "Not safe to rerun: asset 'orders_appended', partition 2026-01-02, property 'rerun':"
        " first run: 6 rows"
    )
    assert "rerun: 12 rows" in text
    assert "Rows only in the rerun (6):" in text
    assert "never an append" in text


def test_a_random_uuid_fails_the_rerun(tmp_path: Path) -> None:
    # idem_assets' publish would refuse uuid4 values itself; dagster-duckdb's IO manager has no
    # such guard, and the kit catches them under any IO manager.
    with pytest.raises(RerunSafetyError) as caught:
        assert_rerun_idempotent(
            [orders, downstream("with_ids", random_ids)],
            resources=duckdb_pandas,
            partition=DAY,
            workdir=tmp_path,
        )
    err = caught.value
    assert (err.property, err.asset) == ("rerun", "with_ids")
    assert len(err.only_first) == len(err.only_second) == 6
    first_ids = {r["row_id"] for r in err.only_first}
    assert first_ids.isdisjoint(r["row_id"] for r in err.only_second)
    assert "uuid5 of the natural key" in str(err)


def test_date_today_in_a_column_fails_the_clock_property(tmp_path: Path) -> None:
    with pytest.raises(RerunSafetyError) as caught:
        assert_clock_invariant(
            [orders, downstream("stamped", stamped_today)],
            resources=resources(),
            partition=DAY,
            workdir=tmp_path,
            clocks=(datetime(2026, 1, 3, 6), datetime(2027, 2, 7, 17)),
        )
    err = caught.value
    assert (err.property, err.asset, err.partition) == ("clock", "stamped", DAY)
    # Read back as the DataFrame the asset declares, so the DATE arrives as a datetime.
    assert {r["exported_on"] for r in err.only_first} == {datetime(2026, 1, 3)}
    assert err.labels[0] == "run at 2026-01-03 06:00 UTC"
    assert err.labels[1].startswith("run at 2027-02-07 17:00 UTC in timezone Etc/GMT")
    # date.today() is the frozen clock's date in the trial's timezone.
    zone = ZoneInfo(err.labels[1].rsplit(" ", 1)[1])
    local = datetime(2027, 2, 7, 17, tzinfo=UTC).astimezone(zone).date()
    assert {r["exported_on"] for r in err.only_second} == {datetime.combine(local, time())}
    assert "datetime.now()" in str(err)


def test_keep_first_without_sorting_fails_the_input_order_property(tmp_path: Path) -> None:
    with pytest.raises(RerunSafetyError) as caught:
        assert_input_order_invariant(
            [orders, downstream("latest_orders", latest_unsorted)],
            resources=resources(),
            partition=DAY,
            workdir=tmp_path,
        )
    err = caught.value
    assert (err.property, err.asset, err.partition) == ("input_order", "latest_orders", DAY)
    # In order, the first copy of order 3 (30.0) wins; reversed, the re-sent one (33.0) does.
    assert [(r["order_id"], r["amount"]) for r in err.only_first] == [(202601023, 30.0)]
    assert [(r["order_id"], r["amount"]) for r in err.only_second] == [(202601023, 33.0)]
    assert "dedupe_order_by" in str(err)


def test_numbering_across_the_run_fails_the_chunking_property(tmp_path: Path) -> None:
    with pytest.raises(RerunSafetyError) as caught:
        assert_chunking_invariant(
            [orders, downstream("numbered", numbered)],
            resources=resources(),
            partition_range=RANGE,
            workdir=tmp_path,
        )
    err = caught.value
    # The first day is numbered 1..6 either way; the second day starts at 7 in a range run.
    assert (err.property, err.asset, err.partition) == ("chunking", "numbered", "2026-01-02")
    assert [r["line"] for r in err.only_first] == [1, 2, 3, 4, 5, 6]
    assert [r["line"] for r in err.only_second] == [7, 8, 9, 10, 11, 12]


def test_the_crash_property_passes_on_one_transaction_and_names_other_writers(
    tmp_path: Path,
) -> None:
    report = assert_crash_safe(
        [orders, downstream("latest_orders", latest_sorted)],
        resources=resources(),
        partition=DAY,
        workdir=tmp_path / "ours",
    )
    assert report.compared == ["orders", "latest_orders"]
    # 1 baseline run, then 4 stages x 2 assets, each a run that crashed.
    assert report.runs == 1 + 4 * 2

    appended = downstream("orders_appended", passthrough, io_manager_key="append_io_manager")
    with pytest.raises(RerunSafetyError) as caught:
        assert_crash_safe(
            [orders, appended], resources=with_append, partition=DAY, workdir=tmp_path / "theirs"
        )
    err = caught.value
    assert (err.property, err.asset) == ("crash", "orders_appended")
    assert "does not publish through idem_assets" in str(err)


def test_a_delete_committed_before_the_publish_loses_the_window_at_a_crash(
    tmp_path: Path,
) -> None:
    with pytest.raises(RerunSafetyError) as caught:
        assert_crash_safe(
            [orders],
            resources={"io_manager": DeleteFirstIOManager(database="w.duckdb")},
            partition=DAY,
            workdir=tmp_path,
        )
    err = caught.value
    assert (err.property, err.asset, err.partition) == ("crash", "orders", DAY)
    assert err.labels == ("window before", "window after a crash at 'guards_passed'")
    assert len(err.only_first) == 6 and err.only_second == []
    assert "a crash part-way leaves a partial window" in str(err)


def test_a_partition_and_not_a_range_skips_chunking_and_says_so(tmp_path: Path) -> None:
    report = assert_rerun_safe(
        [orders], resources=resources(), partition=DAY, workdir=tmp_path, properties=["chunking"]
    )
    assert report.properties == []
    assert report.skipped == {"chunking": "needs a partition_range of two or more partitions"}
    with pytest.raises(ia.ConfigurationError, match="partition_range=\\(first, last\\)"):
        assert_chunking_invariant(
            [orders], resources=resources(), partition=DAY, workdir=tmp_path / "again"
        )


def test_an_outbox_action_whose_content_changes_every_run_fails_the_rerun(
    tmp_path: Path,
) -> None:
    res = {**resources(), "outbox": ia.Outbox(ledger="outbox.sqlite")}
    report = assert_rerun_idempotent(
        [orders, downstream("emailed", email_totals_once)],
        resources=res,
        partition=DAY,
        workdir=tmp_path / "once",
    )
    assert (report.compared, report.not_stored) == (["orders"], ["emailed"])

    with pytest.raises(RerunSafetyError) as caught:
        assert_rerun_idempotent(
            [orders, downstream("emailed", email_totals)],
            resources=res,
            partition=DAY,
            workdir=tmp_path / "every_run",
        )
    err = caught.value
    assert (err.property, err.asset, err.partition) == ("rerun", "emailed", DAY)
    assert "the rerun performed 1 outbox action(s) again, e.g. 'email_totals' revision 2" in str(
        err
    )


def test_the_documented_kit_example_runs_as_printed(tmp_path: Path) -> None:
    code = doc_python("## A first proof", doc="docs/testing.md")
    assert len(code.strip().splitlines()) <= 25
    namespace: dict[str, Any] = {}
    exec(compile(code, "docs/testing.md", "exec"), namespace)
    namespace["test_orders_are_rerun_safe"](tmp_path)


def test_the_documented_outbox_example_sends_once_per_content(tmp_path: Path) -> None:
    namespace: dict[str, Any] = {}
    code = doc_python("## In short", doc="docs/outbox.md")
    exec(compile(code, "docs/outbox.md", "exec"), namespace)
    outbox = ia.Outbox(ledger=str(tmp_path / "outbox.sqlite"))
    for _ in range(2):
        dg.materialize(
            [namespace["revenue_email"]], resources={"outbox": outbox}, partition_key=DAY
        )
    assert namespace["sent"] == [r.delivery.key for r in outbox.records()]
    assert len(namespace["sent"]) == 1


def test_other_io_managers_are_read_back_through_their_own_load_input(tmp_path: Path) -> None:
    assets = [orders, downstream("latest_orders", latest_sorted)]
    report = assert_rerun_safe(
        assets,
        resources=duckdb_pandas,
        partition_range=RANGE,
        workdir=tmp_path / "safe",
        properties=["rerun", "chunking", "input_order", "clock"],
    )
    assert report.compared == ["orders", "latest_orders"]

    # Its DELETE and INSERT are two autocommits, and no publish stage is ever reached.
    with pytest.raises(RerunSafetyError, match="does not publish through idem_assets"):
        assert_crash_safe(
            assets, resources=duckdb_pandas, partition=DAY, workdir=tmp_path / "crash"
        )


def test_without_a_workdir_the_trials_run_in_a_temporary_directory_that_is_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    report = assert_rerun_idempotent([orders], resources=resources(), partition=DAY)
    assert report.compared == ["orders"]
    assert list(tmp_path.iterdir()) == []


SHOPS = dg.MultiPartitionsDefinition(
    {"date": DAILY, "shop": dg.StaticPartitionsDefinition(["harbour", "market"])}
)


@dg.asset(
    name="shop_orders",
    partitions_def=SHOPS,
    metadata={"partition_expr": {"date": "ordered_at", "shop": "shop"}},
)
def shop_orders(context: dg.AssetExecutionContext) -> pd.DataFrame:
    """The orders of each (day, shop) of the run."""
    return cell_orders(context.partition_keys)


def cell_orders(keys: list[str]) -> pd.DataFrame:
    """The orders of each (day, shop) key."""
    frames = []
    for key in keys:
        dims = SHOPS.get_partition_key_from_str(key).keys_by_dimension
        frame = day_orders(date.fromisoformat(dims["date"])).drop_duplicates("order_id")
        frames.append(frame.assign(shop=dims["shop"]))
    return pd.concat(frames, ignore_index=True)


def test_a_multi_partitioned_asset_is_split_by_cell_and_passes(tmp_path: Path) -> None:
    report = assert_rerun_safe(
        [shop_orders],
        resources=resources(),
        partition_range=("2026-01-01|market", "2026-01-02|market"),
        workdir=tmp_path,
        properties=["rerun", "chunking"],
    )
    assert report.partitions == ["2026-01-01|market", "2026-01-02|market"]
    assert report.properties == ["rerun", "chunking"]


def test_a_multi_asset_that_numbers_rows_across_its_run_fails_chunking_on_its_cell(
    tmp_path: Path,
) -> None:
    @dg.asset(
        name="numbered_shop_orders",
        partitions_def=SHOPS,
        metadata={"partition_expr": {"date": "ordered_at", "shop": "shop"}},
    )
    def numbered(context: dg.AssetExecutionContext) -> pd.DataFrame:
        frame = cell_orders(context.partition_keys)
        return frame.assign(position=range(len(frame)))

    with pytest.raises(RerunSafetyError) as caught:
        assert_rerun_safe(
            [numbered],
            resources=resources(),
            partition_range=("2026-01-01|market", "2026-01-02|market"),
            workdir=tmp_path,
            properties=["chunking"],
        )
    # Split by cell, the failure names the one cell that differs, not the whole range.
    assert "partition 2026-01-02|market, property 'chunking'" in str(caught.value)


# Clocks no one can freeze in-process: DuckDB's and numpy's


def own_duckdb(orders: pd.DataFrame, columns: str) -> pd.DataFrame:
    """The orders with ``columns`` added by the asset's own DuckDB connection."""
    con = duckdb.connect()
    try:
        con.register("orders", orders)
        return con.sql(f"SELECT *, {columns} FROM orders").df()
    finally:
        con.close()


def duckdb_current_date(context: dg.AssetExecutionContext, orders: pd.DataFrame) -> pd.DataFrame:
    # The asset's own DuckDB connection reads the machine's clock, not Python's.
    return own_duckdb(orders, "current_date AS exported_on")


def duckdb_now(context: dg.AssetExecutionContext, orders: pd.DataFrame) -> pd.DataFrame:
    return own_duckdb(orders, "now() AS exported_at")


def numpy_today(context: dg.AssetExecutionContext, orders: pd.DataFrame) -> pd.DataFrame:
    return orders.assign(exported_on=np.datetime64("today"))


def numpy_now(context: dg.AssetExecutionContext, orders: pd.DataFrame) -> pd.DataFrame:
    return orders.assign(exported_at=np.datetime64("now"))


def duckdb_day_of_the_data(context: dg.AssetExecutionContext, orders: pd.DataFrame) -> pd.DataFrame:
    """Safe: the date comes from the rows, through the asset's own DuckDB connection."""
    return own_duckdb(orders, "CAST(ordered_at AS DATE) AS order_day")


@pytest.mark.parametrize("fn", [duckdb_current_date, numpy_today], ids=["duckdb", "numpy"])
def test_a_date_from_a_clock_the_kit_cannot_freeze_fails_the_clock_property(
    tmp_path: Path, fn: Any
) -> None:
    with pytest.raises(RerunSafetyError) as caught:
        assert_clock_invariant(
            [orders, downstream("stamped", fn)],
            resources=resources(),
            partition=DAY,
            workdir=tmp_path,
        )
    err = caught.value
    assert (err.property, err.asset, err.partition) == ("clock", "stamped", DAY)
    # Both trials held the real date, but the second ran where the real date is another one.
    zone = ZoneInfo(err.labels[1].rsplit(" ", 1)[1])
    (first,) = {r["exported_on"] for r in err.only_first}
    (second,) = {r["exported_on"] for r in err.only_second}
    assert first.date() == date.today()
    assert second.date() == datetime.now(zone).date() != date.today()
    assert "DuckDB's current_date or now(), numpy's datetime64('today')" in str(err)


@pytest.mark.parametrize("fn", [duckdb_now, numpy_now], ids=["duckdb", "numpy"])
def test_a_time_from_a_clock_the_kit_cannot_freeze_fails_the_rerun(tmp_path: Path, fn: Any) -> None:
    with pytest.raises(RerunSafetyError) as caught:
        assert_rerun_idempotent(
            [orders, downstream("stamped", fn)],
            resources=resources(),
            partition=DAY,
            workdir=tmp_path,
        )
    assert (caught.value.property, caught.value.asset) == ("rerun", "stamped")
    assert len(caught.value.only_first) == len(caught.value.only_second) == 6


def test_dates_of_the_data_through_the_assets_own_duckdb_pass_the_clock_property(
    tmp_path: Path,
) -> None:
    report = assert_clock_invariant(
        [orders, downstream("dated", duckdb_day_of_the_data)],
        resources=resources(),
        partition_range=RANGE,
        workdir=tmp_path,
    )
    assert report.compared == ["orders", "dated"]


# The hash seed: a fresh process under another PYTHONHASHSEED


def set_numbered(context: dg.AssetExecutionContext, orders: pd.DataFrame) -> pd.DataFrame:
    # A set of strings iterates in an order the process's hash seed decides: six a day, so
    # another seed keeps both days' orders about once in 500,000 (1/720 a day).
    keys = [f"order-{i}@{u}" for i, u in zip(orders["order_id"], orders["updated_at"], strict=True)]
    line = {name: n for n, name in enumerate(set(keys))}
    return orders.assign(line=[line[k] for k in keys])


def hash_buckets(context: dg.AssetExecutionContext, orders: pd.DataFrame) -> pd.DataFrame:
    return orders.assign(bucket=[hash(f"order-{i}") % 4 for i in orders["order_id"]])


def stable_numbered(context: dg.AssetExecutionContext, orders: pd.DataFrame) -> pd.DataFrame:
    """Safe: sorted before numbering, and a hash that is the same in every process."""
    names = sorted({f"order-{i}" for i in orders["order_id"]})
    line = {name: n for n, name in enumerate(names)}
    return orders.assign(
        line=[line[f"order-{i}"] for i in orders["order_id"]],
        bucket=[zlib.crc32(f"order-{i}".encode()) % 4 for i in orders["order_id"]],
    )


set_numbered_orders = downstream("numbered_orders", set_numbered)
hash_bucketed_orders = downstream("bucketed_orders", hash_buckets)
stable_numbered_orders = downstream("numbered_orders", stable_numbered)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("asset", "column"),
    [(set_numbered_orders, "line"), (hash_bucketed_orders, "bucket")],
    ids=["set_order", "hash_buckets"],
)
def test_a_value_that_depends_on_the_hash_seed_fails_in_a_fresh_process(
    tmp_path: Path, asset: dg.AssetsDefinition, column: str
) -> None:
    with pytest.raises(RerunSafetyError) as caught:
        assert_hash_seed_invariant(
            [orders, asset], resources=resources(), partition_range=RANGE, workdir=tmp_path
        )
    err = caught.value
    assert (err.property, err.asset) == ("hash_seed", asset.key.to_user_string())
    assert err.labels[1] in (
        "runs in a fresh process (PYTHONHASHSEED=1)",
        "runs in a fresh process (PYTHONHASHSEED=2)",
    )
    # Same orders, other numbers.
    key = ("order_id", "updated_at")
    assert sorted(tuple(r[k] for k in key) for r in err.only_first) == sorted(
        tuple(r[k] for k in key) for r in err.only_second
    )

    def by_order(rows: list[dict[str, Any]]) -> dict[tuple[Any, ...], Any]:
        return {tuple(r[k] for k in key): r[column] for r in rows}

    assert by_order(err.only_first) != by_order(err.only_second)
    assert "hash() of text" in str(err)


@pytest.mark.slow
def test_sorted_sets_and_a_stable_hash_pass_in_a_fresh_process(tmp_path: Path) -> None:
    report = assert_hash_seed_invariant(
        [orders, stable_numbered_orders],
        resources=resources(),
        partition_range=RANGE,
        workdir=tmp_path,
    )
    assert report.compared == ["orders", "numbered_orders"]


def test_an_asset_a_fresh_process_cannot_import_skips_the_hash_seed_and_says_why(
    tmp_path: Path,
) -> None:
    inline = downstream("inline", passthrough)
    report = assert_rerun_safe(
        [orders, inline],
        resources=resources(),
        partition=DAY,
        workdir=tmp_path,
        properties=["hash_seed"],
    )
    assert report.skipped == {
        "hash_seed": "'inline' is not a module-level name, so a fresh process cannot import"
        " it; define it at module level (or in a module-level list) to check it"
    }
    with pytest.raises(ia.ConfigurationError, match="could not start its fresh process"):
        assert_hash_seed_invariant(
            [orders, inline], resources=resources(), partition=DAY, workdir=tmp_path / "again"
        )


# Polars inputs are reversed like pandas and Arrow ones


def polars_latest_unsorted(context: dg.AssetExecutionContext, orders: pl.DataFrame) -> pl.DataFrame:
    return orders.unique("order_id", keep="first", maintain_order=True)


def polars_latest_sorted(context: dg.AssetExecutionContext, orders: pl.DataFrame) -> pl.DataFrame:
    ordered = orders.sort(["order_id", "updated_at"], descending=[False, True])
    return ordered.unique("order_id", keep="first", maintain_order=True)


def test_keep_first_on_a_polars_input_fails_the_input_order_property(tmp_path: Path) -> None:
    with pytest.raises(RerunSafetyError) as caught:
        assert_input_order_invariant(
            [orders, downstream("latest_orders", polars_latest_unsorted)],
            resources=resources(),
            partition=DAY,
            workdir=tmp_path,
        )
    err = caught.value
    assert (err.property, err.asset) == ("input_order", "latest_orders")
    assert [(r["order_id"], r["amount"]) for r in err.only_first] == [(202601023, 30.0)]
    assert [(r["order_id"], r["amount"]) for r in err.only_second] == [(202601023, 33.0)]


def test_a_sorted_polars_input_passes_the_input_order_property(tmp_path: Path) -> None:
    report = assert_input_order_invariant(
        [orders, downstream("latest_orders", polars_latest_sorted)],
        resources=resources(),
        partition=DAY,
        workdir=tmp_path,
    )
    assert (report.compared, report.unseen) == (["orders", "latest_orders"], [])


class ListIOManager(dg.ConfigurableIOManager):
    """Stores a partition's output as a JSON list, and hands it back as a list."""

    directory: str = Field(description="Folder of one file per partition.")

    def handle_output(self, context: dg.OutputContext, obj: list) -> None:
        Path(self.directory).mkdir(parents=True, exist_ok=True)
        (Path(self.directory) / f"{context.partition_key}.json").write_text(json.dumps(obj))

    def load_input(self, context: dg.InputContext) -> list:
        return json.loads((Path(self.directory) / f"{context.partition_key}.json").read_text())


@dg.asset(partitions_def=DAILY, io_manager_key="list_io_manager")
def order_ids(context: dg.AssetExecutionContext) -> list:
    """The day's order ids as a list."""
    return sorted(set(day_orders(date.fromisoformat(context.partition_key))["order_id"]))


@dg.asset(partitions_def=DAILY, io_manager_key="list_io_manager")
def first_order(context: dg.AssetExecutionContext, order_ids: list) -> list:
    """The first id of the list it receives."""
    return order_ids[:1]


def test_an_input_the_kit_cannot_reverse_is_named_in_the_report(tmp_path: Path) -> None:
    def with_lists(directory: Path) -> dict[str, Any]:
        return {"list_io_manager": ListIOManager(directory=str(directory / "lists"))}

    report = assert_input_order_invariant(
        [order_ids, first_order], resources=with_lists, partition=DAY, workdir=tmp_path
    )
    assert report.unseen == [
        "input 'order_ids' of step 'first_order' arrived as list, which the input_order trial"
        " cannot reverse"
    ]
    assert "not seen: input 'order_ids' of step 'first_order'" in str(report)


# Side effects outside the IO managers


class SideFile(dg.ConfigurableResource):
    """A file the asset writes itself, outside every trial's directory."""

    path: str = Field(description="The file.")


class Endpoint(dg.ConfigurableResource):
    """An HTTP endpoint the asset talks to itself."""

    url: str = Field(description="Where to send.")


def appends_a_log_line(
    context: dg.AssetExecutionContext, orders: pd.DataFrame, side_file: SideFile
) -> pd.DataFrame:
    with open(side_file.path, "a") as log:
        log.write(f"{context.partition_key}: {len(orders)} orders\n")
    return orders


def rewrites_a_summary(
    context: dg.AssetExecutionContext, orders: pd.DataFrame, side_file: SideFile
) -> pd.DataFrame:
    """Safe: the same file with the same content on every run."""
    Path(side_file.path).write_text(f"{', '.join(context.partition_keys)}: {len(orders)}\n")
    return orders


def posts_every_run(
    context: dg.AssetExecutionContext, orders: pd.DataFrame, endpoint: Endpoint
) -> pd.DataFrame:
    body = json.dumps({"day": context.partition_key, "orders": len(orders)}).encode()
    request = urllib.request.Request(endpoint.url, data=body, method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        response.read()
    return orders


def posts_through_the_outbox(
    context: dg.AssetExecutionContext,
    orders: pd.DataFrame,
    endpoint: Endpoint,
    outbox: ia.Outbox,
) -> pd.DataFrame:
    """Safe: the POST goes through the outbox, so a rerun with the same content skips it."""

    def post(delivery: ia.Delivery) -> None:
        request = urllib.request.Request(
            endpoint.url,
            data=json.dumps({"day": delivery.partition}).encode(),
            headers={"Idempotency-Key": delivery.key},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()

    for day in context.partition_keys:
        outbox.deliver(context, "post", {"day": day}, post, partition=day)
    return orders


def reads_a_rate(
    context: dg.AssetExecutionContext, orders: pd.DataFrame, endpoint: Endpoint
) -> pd.DataFrame:
    """Safe: a GET only reads."""
    with urllib.request.urlopen(endpoint.url, timeout=10) as response:
        rate = json.loads(response.read())["rate"]
    return orders.assign(amount=orders["amount"] * rate)


def test_a_file_appended_on_every_run_fails_the_rerun(tmp_path: Path) -> None:
    side = tmp_path / "orders.log"
    res = {**resources(), "side_file": SideFile(path=str(side))}
    with pytest.raises(RerunSafetyError) as caught:
        assert_rerun_idempotent(
            [orders, downstream("logged", appends_a_log_line)],
            resources=res,
            partition=DAY,
            workdir=tmp_path / "trials",
        )
    err = caught.value
    assert (err.property, err.asset, err.partition) == ("rerun", "logged", DAY)
    line = len(f"{DAY}: 6 orders\n")
    assert str(err).startswith(
        f"Not safe to rerun: asset 'logged', partition {DAY}, property 'rerun': the rerun wrote"
        f" file {side} outside the IO managers and the outbox, and changed it from {line} to"
        f" {2 * line} bytes; a rerun with the same data must leave it as it was."
    )
    assert "perform the action through ia.Outbox.deliver" in str(err)


def test_a_post_on_every_run_fails_the_rerun(tmp_path: Path) -> None:
    with http_receiver() as receiver:
        res = {**resources(), "endpoint": Endpoint(url=receiver.url)}
        with pytest.raises(RerunSafetyError) as caught:
            assert_rerun_idempotent(
                [orders, downstream("posted", posts_every_run)],
                resources=res,
                partition=DAY,
                workdir=tmp_path,
            )
    err = caught.value
    assert (err.property, err.asset, err.partition) == ("rerun", "posted", DAY)
    assert (
        f"the rerun sent 1 request(s) again, outside the IO managers and the outbox, e.g."
        f" POST {receiver.url}" in str(err)
    )
    assert len(receiver.requests) == 2


def test_side_effects_the_rerun_does_not_repeat_pass(tmp_path: Path) -> None:
    with http_receiver() as receiver:
        res = {
            **resources(),
            "side_file": SideFile(path=str(tmp_path / "summary.txt")),
            "endpoint": Endpoint(url=receiver.url),
            "outbox": ia.Outbox(ledger="outbox.sqlite"),
        }
        report = assert_rerun_idempotent(
            [
                orders,
                downstream("summarised", rewrites_a_summary),
                downstream("delivered", posts_through_the_outbox),
                downstream("converted", reads_a_rate),
            ],
            resources=res,
            partition=DAY,
            workdir=tmp_path / "trials",
        )
    assert sorted(report.compared) == ["converted", "delivered", "orders", "summarised"]
    # Posted once, through the outbox; read once by the run and once by the rerun.
    assert len(receiver.requests) == 1
    assert receiver.reads == 2


# Wrong ranges and range runs of one-partition assets guide instead of crashing


def test_a_reversed_or_misspelt_range_is_refused_with_the_range_that_works(
    tmp_path: Path,
) -> None:
    with pytest.raises(ia.ConfigurationError) as caught:
        assert_rerun_idempotent(
            [orders], resources=resources(), partition_range=("2026-01-02", "2026-01-01")
        )
    assert str(caught.value) == (
        "partition_range=('2026-01-02', '2026-01-01') runs backwards: '2026-01-02' comes after"
        " '2026-01-01', so it holds no partition. Fix: partition_range=('2026-01-01',"
        " '2026-01-02')."
    )
    with pytest.raises(ia.ConfigurationError) as misspelt:
        assert_rerun_idempotent(
            [orders], resources=resources(), partition_range=("2026-1-1", "2026-01-02")
        )
    assert str(misspelt.value) == (
        "partition_range=('2026-1-1', '2026-01-02'): '2026-1-1' is not a partition of the"
        " assets' DailyPartitionsDefinition. Fix: give keys as the definition spells them, e.g."
        " '2026-01-01'."
    )
    report = assert_rerun_idempotent(
        [orders], resources=resources(), partition_range=RANGE, workdir=tmp_path
    )
    assert report.partitions == list(RANGE)


@pytest.mark.parametrize(
    ("policy", "says"),
    [
        (dg.BackfillPolicy.single_run(), "BackfillPolicy.single_run(), so a backfill runs"),
        (dg.BackfillPolicy.multi_run(1), "BackfillPolicy.multi_run(1), so Dagster never runs"),
    ],
    ids=["single_run", "multi_run_1"],
)
def test_a_range_run_of_an_asset_reading_one_partition_key_names_the_partition_form(
    tmp_path: Path, policy: dg.BackfillPolicy, says: str
) -> None:
    @dg.asset(name="one_day", partitions_def=DAILY, metadata=ORDERS_MD, backfill_policy=policy)
    def one_day(context: dg.AssetExecutionContext) -> pd.DataFrame:
        return day_orders(date.fromisoformat(context.partition_key))

    with pytest.raises(Exception) as caught:
        assert_rerun_idempotent(
            [one_day], resources=resources(), partition_range=RANGE, workdir=tmp_path / "range"
        )
    (note,) = caught.value.__notes__
    assert note.startswith(
        "idem_assets.testing: the run of 2026-01-01...2026-01-02 in trial 'baseline' failed"
    ) or note.startswith(
        "idem_assets.testing: the run of 2026-01-01...2026-01-02 in trial 'chunked' failed"
    )
    assert "An asset that reads context.partition_key can run only one partition" in note
    assert f"'one_day' has {says}" in note
    assert note.endswith(
        "or check one partition at a time: assert_rerun_safe(..., partition='2026-01-02'),"
        " which skips chunking."
    )
    # The form the note names works.
    report = assert_rerun_safe(
        [one_day],
        resources=resources(),
        partition="2026-01-02",
        workdir=tmp_path / "one",
        properties=["rerun", "chunking"],
    )
    assert report.skipped["chunking"] == "needs a partition_range of two or more partitions"


def test_a_delta_store_is_moved_into_each_trial_like_a_duckdb_file(tmp_path: Path) -> None:
    # Each trial gets its own Delta folder: sharing one, the second trial's days would overwrite
    # the first's and the comparison would pass whatever the assets did.
    given = tmp_path / "given"
    report = assert_rerun_safe(
        [orders, latest_orders],
        resources={"io_manager": ia.DeltaOverwriteIOManager(root=str(given))},
        partition_range=RANGE,
        workdir=tmp_path / "trials",
        properties=["rerun", "chunking"],
    )
    assert report.compared == ["orders", "latest_orders"]
    assert not given.exists()
    logs = (tmp_path / "trials").glob("*/given/main/*/_delta_log")
    assert sorted((p.parents[3].name, p.parent.name) for p in logs) == [
        ("baseline", "latest_orders"),
        ("baseline", "orders"),
        ("chunked", "latest_orders"),
        ("chunked", "orders"),
    ]


def test_a_store_on_a_server_is_refused_with_a_fix_that_runs(tmp_path: Path) -> None:
    server = ia.PostgresOverwriteIOManager(url="postgresql://kit@127.0.0.1:1/warehouse")
    with pytest.raises(ia.ConfigurationError) as refused:
        assert_rerun_safe(
            [orders], resources={"io_manager": server}, partition=DAY, workdir=tmp_path
        )
    message = str(refused.value)
    assert message.startswith(
        "The rerun-safety kit cannot give each trial a fresh store for resource 'io_manager':"
        " PostgresOverwriteIOManager keeps its tables in "
    )
    assert "password" not in message and "Nothing was run." in message
    # The printed fix, as printed.
    fix = message.split("e.g. resources=", 1)[1].rstrip(".")
    report = assert_rerun_safe(
        [orders], resources=eval(fix, {"ia": ia}), partition=DAY, workdir=tmp_path / "fixed"
    )
    assert report.compared == ["orders"]
