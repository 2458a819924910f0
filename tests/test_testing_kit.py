"""idem_assets.testing catches each unsafe pattern in deliberately unsafe assets, passes safe ones.

Every example is a real asset materialised by the kit on DuckDB files under tmp_path. The publish
guards refuse some run-time values themselves, but not a DATE (date.today() looks like any date)
and not what an IO manager without guards writes, which is why a user needs the kit as well.
"""

import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import duckdb
import pandas as pd
import pyarrow as pa
import pytest
from dagster_duckdb_pandas import DuckDBPandasIOManager
from pydantic import Field

import idem_assets as ia
from idem_assets.testing import (
    RerunSafetyError,
    assert_chunking_invariant,
    assert_clock_invariant,
    assert_crash_safe,
    assert_input_order_invariant,
    assert_rerun_idempotent,
    assert_rerun_safe,
)
from tests.helpers import DAILY, readme_python

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


def test_safe_assets_pass_every_property(tmp_path: Path) -> None:
    report = assert_rerun_safe(
        [orders, downstream("latest_orders", latest_sorted)],
        resources=resources(),
        partition_range=RANGE,
        workdir=tmp_path,
    )
    assert report.properties == ["rerun", "chunking", "input_order", "clock", "crash"]
    assert report.compared == ["orders", "latest_orders"]
    assert report.partitions == ["2026-01-01", "2026-01-02"]
    # Day by day twice, the range twice, reversed inputs, the second clock; 4 crashes per asset.
    assert report.runs == 2 + 2 + 1 + 1 + 2 + 2 + 4 * 2
    assert report.skipped == {}


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
    assert {r["exported_on"] for r in err.only_second} == {datetime(2027, 2, 7)}
    assert err.labels == ("run at 2026-01-03 06:00 UTC", "run at 2027-02-07 17:00 UTC")
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


def test_the_readme_kit_example_runs_as_printed(tmp_path: Path) -> None:
    code = readme_python("## Prove your own assets are safe to rerun")
    assert len(code.strip().splitlines()) <= 25
    namespace: dict[str, Any] = {}
    exec(compile(code, "README.md", "exec"), namespace)
    namespace["test_orders_are_rerun_safe"](tmp_path)


def test_the_readme_outbox_example_sends_once_per_content(tmp_path: Path) -> None:
    namespace: dict[str, Any] = {}
    code = readme_python("## Side effects a rerun does not repeat: the outbox")
    exec(compile(code, "README.md", "exec"), namespace)
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
