"""Write-audit-publish: checks run on the staged batch and only a passing batch is published."""

import math
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pandas as pd
import pyarrow as pa
import pytest

import idem_assets as ia
from idem_assets.lib.dagster_layer.check_reports import split_by_partition

from .support import (
    DAILY,
    DAYS,
    check_statuses,
    count,
    fingerprint,
    read,
    run,
    trips,
    trips_between,
    window,
)

Source = Callable[[dg.AssetExecutionContext], Any]

BETWEEN = ia.between("passenger_count", 1, 6)
CHECKS = [
    ia.row_count(1000),
    ia.not_null("trip_id"),
    ia.unique("trip_id"),
    BETWEEN,
    ia.freshness("pickup_at", timedelta(hours=3)),
]


def in_window_trips(context: dg.AssetExecutionContext) -> pd.DataFrame:
    tw = context.partition_time_window
    return trips_between(tw.start, tw.end)


def pipeline(
    source: Source = in_window_trips,
    checks: list[ia.Check] | None = None,
    metadata: dict[str, Any] | None = None,
    io_manager: str = "overwrite_io_manager",
) -> list[dg.AssetsDefinition]:
    """An audited trips asset and a downstream asset that reads it."""

    @ia.audited_asset(
        checks=CHECKS if checks is None else checks,
        partitions_def=DAILY,
        io_manager_key=io_manager,
        metadata=metadata or {"partition_expr": "pickup_at"},
    )
    def trips(context: dg.AssetExecutionContext) -> pd.DataFrame:
        """Trips, audited before they are published."""
        return source(context)

    @dg.asset(
        partitions_def=DAILY,
        io_manager_key="overwrite_io_manager",
        metadata={"partition_expr": "pickup_at"},
    )
    def busy_trips(trips: pd.DataFrame) -> pd.DataFrame:
        """Trips with four or more passengers."""
        return trips[trips["passenger_count"] >= 4]

    return [trips, busy_trips]


def evaluations(result: dg.ExecuteInProcessResult, day: str = "2026-01-02") -> dict[str, Any]:
    """The run's check evaluations for one day, by check name."""
    return {e.check_name: e for e in result.get_asset_check_evaluations() if e.partition == day}


def measured(evaluation: Any, *keys: str) -> dict[str, Any]:
    """Some metadata values of an evaluation."""
    return {k: evaluation.metadata[k].value for k in keys}


ROW_COUNT = ("rows", "expected", "delta")


def materialized(result: dg.ExecuteInProcessResult) -> list[str]:
    return sorted(
        e.materialization.asset_key.to_user_string()
        for e in result.get_asset_materialization_events()
    )


def with_bad_passengers(context: dg.AssetExecutionContext) -> pd.DataFrame:
    batch = in_window_trips(context)
    batch.loc[[10, 20, 30], "passenger_count"] = 9
    return batch


def test_a_passing_batch_is_published_with_every_check_passed(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    result = run(pipeline(), db, "2026-01-02")

    assert result.success
    checks = evaluations(result)
    assert sorted(checks) == sorted([c.name for c in CHECKS] + ["in_window"])
    assert all(e.passed for e in checks.values())
    assert measured(checks["row_count"], *ROW_COUNT) == {"rows": 1000, "expected": 1000, "delta": 0}
    assert materialized(result) == ["busy_trips", "trips"]
    with read(db) as conn:
        assert count(conn, day="2026-01-02") == 1000


def test_a_failing_blocking_check_stops_the_run_and_keeps_the_last_good_data(
    tmp_path: Path,
) -> None:
    db = tmp_path / "w.duckdb"
    batches: dict[str, Source] = {"source": in_window_trips}
    assets = pipeline(lambda ctx: batches["source"](ctx))
    run(assets, db, "2026-01-02")
    with read(db) as conn:
        last_good = fingerprint(conn)

    batches["source"] = with_bad_passengers
    result = run(assets, db, "2026-01-02", raise_on_error=False)

    assert not result.success
    failure = result.failure_data_for_node("trips")
    assert failure is not None and failure.error is not None
    cause = failure.error.cause  # Dagster wraps the user error
    assert cause is not None and cause.cls_name == "BlockingCheckError"
    assert f"{BETWEEN.name}: 3 failing row(s)" in cause.message
    assert "readers keep the last good data" in cause.message
    checks = evaluations(result)
    between = checks[BETWEEN.name]
    assert not between.passed
    assert between.severity == dg.AssetCheckSeverity.ERROR
    assert between.metadata["failing"].value == 3
    sample = between.metadata["failing_sample"].value
    assert sample.count("| 9 |") == 3
    assert all(e.passed for name, e in checks.items() if name != BETWEEN.name)
    assert materialized(result) == []  # neither trips nor the downstream busy_trips
    with read(db) as conn:
        assert fingerprint(conn) == last_good


def test_a_failing_warn_check_still_publishes(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    warn = ia.between("passenger_count", 1, 6, blocking=False)
    result = run(pipeline(with_bad_passengers, checks=[warn]), db, "2026-01-02")

    assert result.success
    evaluation = evaluations(result)[warn.name]
    assert not evaluation.passed
    assert evaluation.severity == dg.AssetCheckSeverity.WARN
    assert evaluation.metadata["failing"].value == 3
    assert materialized(result) == ["busy_trips", "trips"]
    with read(db) as conn:
        assert conn.execute("SELECT count(*) FROM trips WHERE passenger_count = 9").fetchall() == [
            (3,)
        ]


def test_a_stray_row_fails_the_always_on_in_window_check(tmp_path: Path) -> None:
    def with_stray(context: dg.AssetExecutionContext) -> pd.DataFrame:
        return pd.concat([in_window_trips(context), trips("2026-01-01", 1, first_id=1)])

    result = run(
        pipeline(with_stray, checks=[]), tmp_path / "w.duckdb", "2026-01-02", raise_on_error=False
    )

    assert not result.success
    in_window = evaluations(result)["in_window"]
    assert not in_window.passed
    assert in_window.metadata["failing"].value == 1
    assert "2026-01-01 00:00:00" in in_window.metadata["failing_sample"].value


def test_bare_string_key_metadata_dedupes_the_staged_batch(tmp_path: Path) -> None:
    def resent(context: dg.AssetExecutionContext) -> pd.DataFrame:
        batch = in_window_trips(context).assign(updated_at=datetime(2026, 1, 5))
        again = batch.iloc[:10].assign(fare=99.0, updated_at=datetime(2026, 1, 6))
        return pd.concat([again, batch], ignore_index=True)

    metadata = {
        "partition_expr": "pickup_at",
        "primary_key": "trip_id",
        "dedupe_order_by": "updated_at",
    }
    db = tmp_path / "w.duckdb"
    result = run(
        pipeline(resent, [ia.unique("trip_id")], metadata, "merge_io_manager"), db, "2026-01-02"
    )

    assert result.success
    with read(db) as conn:
        assert count(conn) == 1000
        assert conn.execute("SELECT count(*) FROM trips WHERE fare = 99").fetchall() == [(10,)]


# Check semantics, called directly ----------------------------------------------------------------


def verdict(report: ia.AuditReport, name: str) -> Any:
    (found,) = [v for v in report.verdicts if v.check.name == name]
    return found


def test_between_fails_on_nan_and_infinities_but_not_null() -> None:
    values = [1.0, math.nan, math.inf, -math.inf, 6.0, None]
    table = pa.table({"passenger_count": pa.array(values, pa.float64())})

    report = ia.audit_table(table, [BETWEEN, ia.not_null("passenger_count")], None, None)

    assert verdict(report, BETWEEN.name).failing == 3
    assert verdict(report, "passenger_count_not_null").failing == 1
    assert len(verdict(report, BETWEEN.name).sample) == 3


def test_pandas_nan_arrives_as_null_so_not_null_catches_it() -> None:
    # pyarrow turns a pandas NaN into NULL; between() skips NULLs, not_null() fails them.
    frame = pd.DataFrame({"passenger_count": [1.0, math.nan, 3.0]})
    table = pa.Table.from_pandas(frame, preserve_index=False)

    report = ia.audit_table(table, [BETWEEN, ia.not_null("passenger_count")], None, None)

    assert verdict(report, BETWEEN.name).passed
    assert verdict(report, "passenger_count_not_null").failing == 1


def test_between_accepts_numpy_and_infinite_bounds() -> None:
    import numpy as np

    table = pa.table({"fare": [0.5, 10.0, 1e12]})
    checks = [ia.between("fare", np.float64(1.0), float("inf"), name="fare_at_least_1")]
    assert verdict(ia.audit_table(table, checks, None, None), "fare_at_least_1").failing == 1


@pytest.mark.parametrize(
    ("hours_before_end", "passed"), [(5, False), (3, True), (2, True)], ids=["5h", "3h", "2h"]
)
@pytest.mark.parametrize("aware", [False, True], ids=["naive", "tz-aware"])
def test_freshness_is_measured_from_the_partition_end(
    hours_before_end: int, passed: bool, aware: bool
) -> None:
    newest = datetime(2026, 1, 3) - timedelta(hours=hours_before_end)
    frame = pd.DataFrame({"pickup_at": [datetime(2026, 1, 2, 1), newest]})
    if aware:
        frame["pickup_at"] = frame["pickup_at"].dt.tz_localize("UTC")
    check = ia.freshness("pickup_at", timedelta(hours=3))

    report = ia.audit_table(pa.Table.from_pandas(frame), [check], "pickup_at", window("2026-01-02"))

    result = verdict(report, check.name)
    assert result.passed is passed
    assert result.per_partition["2026-01-02"]["lag"] == f"{hours_before_end}:00:00"


def test_freshness_needs_a_partitioned_asset() -> None:
    table = pa.table({"pickup_at": [datetime(2026, 1, 2)]})
    with pytest.raises(ia.ConfigurationError, match="unpartitioned"):
        ia.audit_table(table, [ia.freshness("pickup_at", timedelta(hours=1))], None, None)


# Expected counts and ranges ----------------------------------------------------------------------


@pytest.mark.parametrize(("expected", "passed"), [(1000, True), (1001, False)])
def test_a_batch_carries_its_expected_row_count(
    tmp_path: Path, expected: int, passed: bool
) -> None:
    def with_manifest(context: dg.AssetExecutionContext) -> ia.Batch:
        return ia.Batch(in_window_trips(context), expected_rows={context.partition_key: expected})

    db = tmp_path / "w.duckdb"
    result = run(
        pipeline(with_manifest, [ia.row_count(min_rows=1)]), db, "2026-01-02", raise_on_error=False
    )

    assert result.success is passed
    row_count = evaluations(result)["row_count"]
    assert row_count.passed is passed
    assert measured(row_count, *ROW_COUNT) == {
        "rows": 1000,
        "expected": expected,
        "delta": 1000 - expected,
    }
    with read(db) as conn:
        assert (fingerprint(conn) is not None) is passed


def test_a_range_run_reports_checks_per_partition(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    result = run(pipeline(), db, partition_range=(DAYS[0], DAYS[-1]))

    assert result.success
    for day in DAYS:
        checks = evaluations(result, day)
        assert measured(checks["row_count"], *ROW_COUNT) == {
            "rows": 1000,
            "expected": 1000,
            "delta": 0,
        }
        assert checks["pickup_at_freshness"].metadata["lag"].value == "1:48:00"
    with read(db) as conn:
        assert [count(conn, day=day) for day in DAYS] == [1000, 1000, 1000]


def test_a_short_day_in_a_range_fails_that_day_only() -> None:
    table = pa.Table.from_pandas(
        pd.concat([trips("2026-01-01"), trips("2026-01-02", 990), trips("2026-01-03")])
    )
    report = ia.audit_table(table, [ia.row_count(1000)], "pickup_at", window(*DAYS))

    result = verdict(report, "row_count")
    assert not result.passed
    assert result.failing == 1
    assert result.detail == "1 of 3 partition(s) failed: 2026-01-02"
    assert result.per_partition["2026-01-02"] == {"rows": 990, "expected": 1000, "delta": -10}


def test_an_unpartitioned_batch_is_judged_as_one_group() -> None:
    table = pa.table({"id": [1, 2, 2]})
    report = ia.audit_table(table, [ia.row_count(3), ia.unique("id")], None, None)

    assert verdict(report, "row_count").per_partition == {
        "all": {"rows": 3, "expected": 3, "delta": 0}
    }
    assert verdict(report, "id_unique").failing == 1
    assert [v.check.name for v in report.blocking_failures] == ["id_unique"]


def test_row_count_without_a_declared_count_fails(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    result = run(pipeline(checks=[ia.row_count()]), db, "2026-01-02", raise_on_error=False)

    assert not result.success
    verdict = evaluations(result)["row_count"]
    assert not verdict.passed
    assert measured(verdict, *ROW_COUNT) == {"rows": 1000, "expected": None, "delta": None}


def test_row_count_takes_the_count_the_batch_declares(tmp_path: Path) -> None:
    def declared(context: dg.AssetExecutionContext) -> ia.Batch:
        return ia.Batch(in_window_trips(context), expected_rows={"2026-01-02": 999})

    result = run(
        pipeline(declared, checks=[ia.row_count()]),
        tmp_path / "w.duckdb",
        "2026-01-02",
        raise_on_error=False,
    )

    verdict = evaluations(result)["row_count"]
    assert measured(verdict, *ROW_COUNT) == {"rows": 1000, "expected": 999, "delta": 1}
    assert not result.success


def test_an_audited_asset_must_take_context_first() -> None:
    with pytest.raises(ia.ConfigurationError, match="first parameter must be `context`"):

        @ia.audited_asset(checks=[ia.not_null("trip_id")])
        def trips(upstream: pd.DataFrame) -> pd.DataFrame:
            return upstream


# Names the library uses internally -------------------------------------------------------------

#: Column names the audit's own SQL once used for its staged batch and its windows table.
INTERNAL_NAMES = ("key", "w_start", "w_end", "staged", "windows")


def test_user_columns_named_like_the_audits_internals_are_checked_like_any_other(
    tmp_path: Path,
) -> None:
    def with_internal_names(context: dg.AssetExecutionContext) -> pd.DataFrame:
        batch = in_window_trips(context)
        return batch.assign(**{name: batch["passenger_count"] for name in INTERNAL_NAMES})

    checks = [ia.not_null(name) for name in INTERNAL_NAMES]
    checks += [ia.between(name, 1, 6) for name in INTERNAL_NAMES]
    checks += [ia.unique("trip_id", *INTERNAL_NAMES)]
    db = tmp_path / "w.duckdb"
    assets = pipeline(with_internal_names, checks=checks)

    first = run(assets, db, "2026-01-02")
    with read(db) as conn:
        once = fingerprint(conn)
    run(assets, db, "2026-01-02")

    assert all(e.passed for e in evaluations(first).values())
    assert len(evaluations(first)) == len(checks) + 1  # and in_window
    with read(db) as conn:
        assert fingerprint(conn) == once
        assert count(conn, day="2026-01-02") == 1000
        assert conn.execute("SELECT sum(key), sum(windows) FROM trips").fetchall() == [(3496, 3496)]


def test_a_failing_check_on_a_column_named_key_samples_its_rows(tmp_path: Path) -> None:
    def with_null_key(context: dg.AssetExecutionContext) -> pd.DataFrame:
        batch = in_window_trips(context).assign(key=1.0)
        batch.loc[[3, 4], "key"] = None
        return batch

    result = run(
        pipeline(with_null_key, checks=[ia.not_null("key")]),
        tmp_path / "w.duckdb",
        "2026-01-02",
        raise_on_error=False,
    )

    evaluation = evaluations(result)["key_not_null"]
    assert not evaluation.passed
    assert evaluation.metadata["failing"].value == 2
    assert evaluation.metadata["failing_sample"].value.count("| None |") == 2


def test_checks_on_non_ascii_columns_get_valid_check_names(tmp_path: Path) -> None:
    def spanish(context: dg.AssetExecutionContext) -> pd.DataFrame:
        return in_window_trips(context).rename(columns={"fare": "tarifa_é"})

    checks = [
        ia.not_null("tarifa_é"),
        ia.unique("trip_id", "tarifa_é"),
        ia.between("tarifa_é", 0, 60),
    ]
    result = run(pipeline(spanish, checks=checks), tmp_path / "w.duckdb", "2026-01-02")

    assert sorted(evaluations(result)) == [
        "in_window",
        "tarifa___between_0_and_60",
        "tarifa___not_null",
        "trip_id_tarifa___unique",
    ]
    assert all(e.passed for e in evaluations(result).values())


def with_dates(context: dg.AssetExecutionContext) -> pd.DataFrame:
    """Trips dated by a DATE column, each reported the day after its pickup."""
    batch = in_window_trips(context)
    return batch.assign(
        service_date=batch["pickup_at"].dt.date,
        reported_on=(batch["pickup_at"] + timedelta(days=1)).dt.date,
    )


def test_freshness_on_a_date_column_counts_each_date_as_the_end_of_its_day(
    tmp_path: Path,
) -> None:
    fresh = ia.freshness("service_date", timedelta(hours=1))
    late = ia.freshness("reported_on", timedelta(hours=1), blocking=False)
    metadata = {"partition_expr": "service_date"}
    db = tmp_path / "w.duckdb"

    result = run(pipeline(with_dates, [fresh, late], metadata), db, "2026-01-02")

    checks = evaluations(result)
    assert checks[fresh.name].passed
    assert measured(checks[fresh.name], "newest", "lag") == {
        "newest": "2026-01-02",
        "lag": "0:00:00",
    }
    # A date after the window's end is newer than its end: a negative lag, which passes.
    assert checks[late.name].passed
    assert measured(checks[late.name], "newest", "lag") == {
        "newest": "2026-01-03",
        "lag": "-1 day, 0:00:00",
    }
    with read(db) as conn:
        assert count(conn, day="2026-01-02") == 1000


def test_freshness_on_a_date_column_fails_a_day_whose_newest_date_is_earlier(
    tmp_path: Path,
) -> None:
    def a_day_late(context: dg.AssetExecutionContext) -> pd.DataFrame:
        batch = with_dates(context)
        return batch.assign(reported_on=(batch["pickup_at"] - timedelta(days=1)).dt.date)

    check = ia.freshness("reported_on", timedelta(hours=1))
    result = run(
        pipeline(a_day_late, [check]), tmp_path / "w.duckdb", "2026-01-02", raise_on_error=False
    )

    evaluation = evaluations(result)[check.name]
    assert not evaluation.passed
    assert measured(evaluation, "newest", "lag", "failing") == {
        "newest": "2026-01-01",
        "lag": "1 day, 0:00:00",
        "failing": 1,
    }


# Per-day verdicts in the instance ----------------------------------------------------------------


def refusal_message(result: dg.ExecuteInProcessResult, node: str = "trips") -> str:
    """The message of the error that refused the step (Dagster wraps the user error)."""
    failure = result.failure_data_for_node(node)
    assert failure is not None and failure.error is not None and failure.error.cause is not None
    return failure.error.cause.message


def bad_passengers_on(day: str) -> Source:
    """The window's trips, with three trips of ``day`` carrying 9 passengers."""

    def source(context: dg.AssetExecutionContext) -> pd.DataFrame:
        batch = in_window_trips(context)
        rows = batch.index[batch["pickup_at"].dt.strftime("%Y-%m-%d") == day][[10, 20, 30]]
        batch.loc[rows, "passenger_count"] = 9
        return batch

    return source


def test_a_chunk_with_one_bad_day_records_that_day_failed_and_the_others_passed(
    tmp_path: Path,
) -> None:
    db = tmp_path / "w.duckdb"
    with dg.instance_for_test() as instance:
        result = run(
            pipeline(bad_passengers_on("2026-01-02")),
            db,
            partition_range=(DAYS[0], DAYS[-1]),
            raise_on_error=False,
            instance=instance,
        )

        assert not result.success
        assert check_statuses(instance, "trips", BETWEEN.name) == {
            "2026-01-01": "SUCCEEDED",
            "2026-01-02": "FAILED",
            "2026-01-03": "SUCCEEDED",
        }
        for check in [*CHECKS, ia.in_window("pickup_at")]:
            if check.name != BETWEEN.name:
                assert set(check_statuses(instance, "trips", check.name).values()) == {"SUCCEEDED"}
        assert instance.get_materialized_partitions(dg.AssetKey("trips")) == set()
    bad = evaluations(result, "2026-01-02")[BETWEEN.name]
    assert bad.metadata["failing"].value == 3
    assert (bad.partition, bad.metadata["detail"].value) == ("2026-01-02", "3 failing row(s)")
    assert bad.metadata["failing_sample"].value.count("| 9 |") == 3
    assert bad.target_materialization_data is None
    assert "refused before any write" in bad.metadata["judged"].value
    good = evaluations(result, "2026-01-01")[BETWEEN.name]
    assert (good.passed, good.metadata["failing"].value) == (True, 0)
    assert "failing_sample" not in good.metadata
    assert "Days that failed: 2026-01-02;" in refusal_message(result)
    with read(db) as conn:
        assert fingerprint(conn) is None  # nothing of the chunk was written


def test_each_verdict_points_at_the_materialization_it_judged_and_none_stays_planned(
    tmp_path: Path,
) -> None:
    db = tmp_path / "w.duckdb"
    with dg.instance_for_test() as instance:
        chunk = run(pipeline(), db, partition_range=(DAYS[0], DAYS[-1]), instance=instance)
        rerun = run(pipeline(), db, "2026-01-02", instance=instance)

        for result in (chunk, rerun):
            mats = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=dg.AssetKey("trips")), limit=10
            ).records
            judged = {m.partition_key: m.storage_id for m in mats if m.run_id == result.run_id}
            for evaluation in result.get_asset_check_evaluations():
                target = evaluation.target_materialization_data
                assert target is not None and target.run_id == result.run_id
                assert target.storage_id == judged[evaluation.partition]
        for check in [*CHECKS, ia.in_window("pickup_at")]:
            history = instance.event_log_storage.get_asset_check_execution_history(
                dg.AssetCheckKey(dg.AssetKey("trips"), check.name), limit=100
            )
            # Three days, then one: one SUCCEEDED record each, no PLANNED (shown as skipped) left.
            assert sorted((r.partition, r.status.value) for r in history) == [
                ("2026-01-01", "SUCCEEDED"),
                ("2026-01-02", "SUCCEEDED"),
                ("2026-01-02", "SUCCEEDED"),
                ("2026-01-03", "SUCCEEDED"),
            ]


def test_a_stray_row_fails_every_day_of_the_chunk_because_no_day_owns_it(tmp_path: Path) -> None:
    def with_stray(context: dg.AssetExecutionContext) -> pd.DataFrame:
        return pd.concat([in_window_trips(context), trips("2026-01-04", 1, first_id=1)])

    with dg.instance_for_test() as instance:
        result = run(
            pipeline(with_stray, checks=[]),
            tmp_path / "w.duckdb",
            partition_range=(DAYS[0], DAYS[-1]),
            raise_on_error=False,
            instance=instance,
        )
        assert check_statuses(instance, "trips", "in_window") == dict.fromkeys(DAYS, "FAILED")
    verdict = evaluations(result, "2026-01-03")["in_window"]
    assert verdict.metadata["failing"].value == 1
    assert "belong to no single day (outside every day" in verdict.metadata["detail"].value
    assert "2026-01-04 00:00:00" in verdict.metadata["failing_sample"].value
    assert "Days that failed: 2026-01-01, 2026-01-02, 2026-01-03;" in refusal_message(result)


def test_an_unpartitioned_asset_reports_one_verdict_per_check_after_its_output(
    tmp_path: Path,
) -> None:
    @ia.audited_asset(checks=[ia.unique("trip_id")], io_manager_key="overwrite_io_manager")
    def all_trips(context: dg.AssetExecutionContext) -> pd.DataFrame:
        """All trips, unpartitioned."""
        return trips("2026-01-02")

    with dg.instance_for_test() as instance:
        result = run([all_trips], tmp_path / "w.duckdb", instance=instance)
        assert check_statuses(instance, "all_trips", "trip_id_unique") == {None: "SUCCEEDED"}
        key = dg.AssetKey("all_trips")
        (materialization,) = instance.fetch_materializations(key, limit=5).records
    (evaluation,) = result.get_asset_check_evaluations()
    target = evaluation.target_materialization_data
    assert target is not None and target.storage_id == materialization.storage_id


def test_a_key_two_days_share_fails_every_day_and_a_day_duplicate_only_its_day() -> None:
    shared = pd.concat([trips("2026-01-01", 10), trips("2026-01-02", 10, first_id=20260101_0000)])
    within = pd.concat([trips("2026-01-01", 10), trips("2026-01-01", 2), trips("2026-01-02", 10)])
    check = ia.unique("trip_id")

    def days(frame: pd.DataFrame) -> dict[str, tuple[bool, int]]:
        table = pa.Table.from_pandas(frame, preserve_index=False)
        report = ia.audit_table(table, [check], "pickup_at", window(*DAYS[:2]))
        split = split_by_partition(table, report.verdicts, "pickup_at", window(*DAYS[:2]))
        return {d.key: (d.passed, d.failing) for d in split}

    assert days(shared) == {"2026-01-01": (False, 10), "2026-01-02": (False, 10)}
    assert days(within) == {"2026-01-01": (False, 2), "2026-01-02": (True, 0)}


# Every partition kind: a verdict per static key, dynamic key and (day, region) cell

REGIONS = dg.StaticPartitionsDefinition(["east", "north", "south"])
STORES = dg.DynamicPartitionsDefinition(name="stores")
DAY_BY_REGION = dg.MultiPartitionsDefinition({"date": DAILY, "region": REGIONS})
BY_DAY_AND_REGION = {"date": "pickup_at", "region": "region"}


def region_trips(day: str, region: str, n: int = 50) -> pd.DataFrame:
    """``n`` trips of ``region`` on ``day``; ids unique across days and regions."""
    first = int(day.replace("-", "")) * 10_000 + ["east", "north", "south"].index(region) * 1000
    return trips(day, n, first_id=first).assign(region=region)


def cells_of(context: dg.AssetExecutionContext) -> list[tuple[str, str]]:
    """``(day, region)`` of each key of the run; a one-dimensional key is a region of DAYS[0]."""
    pdef = context.assets_def.partitions_def
    if isinstance(pdef, dg.MultiPartitionsDefinition):
        keys = [
            pdef.get_partition_key_from_str(k).keys_by_dimension for k in context.partition_keys
        ]
        return [(k["date"], k["region"]) for k in keys]
    return [(DAYS[0], k) for k in context.partition_keys]


def audited_by_kind(
    partitions_def: dg.PartitionsDefinition,
    bad_cell: tuple[str, str] | None = None,
    extra: pd.DataFrame | None = None,
) -> dg.AssetsDefinition:
    """Audited trips per region (and day); ``bad_cell`` gets three passenger counts of 9."""
    multi = isinstance(partitions_def, dg.MultiPartitionsDefinition)

    @ia.audited_asset(
        checks=[BETWEEN, ia.row_count(50), ia.unique("trip_id")],
        partitions_def=partitions_def,
        io_manager_key="overwrite_io_manager",
        metadata={"partition_expr": BY_DAY_AND_REGION if multi else "region"},
    )
    def sales(context: dg.AssetExecutionContext) -> pd.DataFrame:
        """Trips of the run's regions (and days), audited before they are published."""
        frames = []
        for day, region in cells_of(context):
            frame = region_trips(day, region)
            if (day, region) == bad_cell:
                frame.loc[[1, 2, 3], "passenger_count"] = 9
            frames.append(frame)
        return pd.concat([*frames, *([] if extra is None else [extra])], ignore_index=True)

    return sales


def statuses(instance: dg.DagsterInstance, result: dg.ExecuteInProcessResult) -> dict:
    """The latest status of each (check, partition) the run recorded."""
    found: dict[tuple[str, str], str] = {}
    for check in ("passenger_count_between_1_and_6", "row_count", "trip_id_unique", "in_window"):
        for part, status in check_statuses(instance, "sales", check, result.run_id).items():
            found[(check, str(part))] = status
    return found


def test_an_audited_static_asset_records_a_verdict_per_key_and_blocks_a_failing_one(
    tmp_path: Path,
) -> None:
    db = tmp_path / "w.duckdb"
    with dg.instance_for_test() as instance:
        failed = run(
            [audited_by_kind(REGIONS, bad_cell=(DAYS[0], "north"))],
            db,
            partition_range=("east", "south"),
            raise_on_error=False,
            instance=instance,
        )
        assert not failed.success
        found = statuses(instance, failed)
        assert {k: v for k, v in found.items() if v != "SUCCEEDED"} == {
            ("passenger_count_between_1_and_6", "north"): "FAILED"
        }
        assert len(found) == 4 * 3
        assert instance.get_materialized_partitions(dg.AssetKey("sales")) == set()
        assert "Partitions that failed: north;" in refusal_message(failed, "sales")
        bad = evaluations(failed, "north")[BETWEEN.name]
        assert bad.metadata["failing"].value == 3
        assert bad.metadata["failing_sample"].value.count("| 9 |") == 3

        published = run([audited_by_kind(REGIONS)], db, "north", instance=instance)
        assert set(statuses(instance, published).values()) == {"SUCCEEDED"}
        key = dg.AssetKey("sales")
        (mat,) = instance.fetch_materializations(key, limit=5).records
        for evaluation in published.get_asset_check_evaluations():
            target = evaluation.target_materialization_data
            assert evaluation.partition == mat.partition_key == "north"
            assert target is not None and target.storage_id == mat.storage_id
    with read(db) as conn:
        assert conn.execute("SELECT DISTINCT region FROM sales").fetchall() == [("north",)]


def test_an_audited_day_by_region_asset_judges_each_cell_as_it_judges_each_day(
    tmp_path: Path,
) -> None:
    db = tmp_path / "w.duckdb"
    cells = [f"{day}|north" for day in DAYS]
    with dg.instance_for_test() as instance:
        failed = run(
            [audited_by_kind(DAY_BY_REGION, bad_cell=(DAYS[1], "north"))],
            db,
            partition_range=(cells[0], cells[-1]),
            raise_on_error=False,
            instance=instance,
        )
        assert check_statuses(instance, "sales", BETWEEN.name, failed.run_id) == {
            cells[0]: "SUCCEEDED",
            cells[1]: "FAILED",
            cells[2]: "SUCCEEDED",
        }
        assert "Partitions that failed: 2026-01-02|north;" in refusal_message(failed, "sales")
        assert evaluations(failed, cells[1])[BETWEEN.name].metadata["failing"].value == 3

        # A row of another region belongs to no cell of the run: every cell fails in_window.
        stray = region_trips(DAYS[1], "south", 1)
        strayed = run(
            [audited_by_kind(DAY_BY_REGION, extra=stray)],
            db,
            partition_range=(cells[0], cells[-1]),
            raise_on_error=False,
            instance=instance,
        )
        assert check_statuses(instance, "sales", "in_window", strayed.run_id) == dict.fromkeys(
            cells, "FAILED"
        )
        verdict = evaluations(strayed, cells[0])["in_window"]
        assert verdict.metadata["detail"].value == (
            "0 failing row(s); 1 more failing row(s) of this run's batch belong to no single"
            " partition (outside every partition of its window, or a key that two partitions"
            " share), so every partition of the run fails"
        )
        assert "| south |" in verdict.metadata["failing_sample"].value

        published = run(
            [audited_by_kind(DAY_BY_REGION)],
            db,
            partition_range=(cells[0], cells[-1]),
            instance=instance,
        )
        assert set(statuses(instance, published).values()) == {"SUCCEEDED"}
        rows = {
            e.partition: e.metadata["rows"].value
            for e in published.get_asset_check_evaluations()
            if e.check_name == "row_count"
        }
        assert rows == dict.fromkeys(cells, 50)
    with read(db) as conn:
        assert conn.execute("SELECT count(*) FROM sales").fetchall() == [(150,)]


def test_an_audited_dynamic_asset_records_a_verdict_per_key(tmp_path: Path) -> None:
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("stores", ["east", "north"])
        result = run(
            [audited_by_kind(STORES, bad_cell=(DAYS[0], "east"))],
            tmp_path / "w.duckdb",
            partition_range=("east", "north"),
            raise_on_error=False,
            instance=instance,
        )
        assert check_statuses(instance, "sales", BETWEEN.name, result.run_id) == {
            "east": "FAILED",
            "north": "SUCCEEDED",
        }


def test_freshness_of_a_day_by_region_cell_is_measured_from_the_end_of_its_day(
    tmp_path: Path,
) -> None:
    @ia.audited_asset(
        checks=[ia.freshness("pickup_at", timedelta(hours=3))],
        partitions_def=DAY_BY_REGION,
        io_manager_key="overwrite_io_manager",
        metadata={"partition_expr": BY_DAY_AND_REGION},
    )
    def sales(context: dg.AssetExecutionContext) -> pd.DataFrame:
        """Trips of one cell."""
        ((day, region),) = cells_of(context)
        return region_trips(day, region, 1000)

    result = run([sales], tmp_path / "w.duckdb", f"{DAYS[1]}|east")
    verdict = evaluations(result, f"{DAYS[1]}|east")["pickup_at_freshness"]
    assert verdict.passed
    assert verdict.metadata["lag"].value == "1:48:00"


def test_an_audited_lone_empty_key_is_judged_empty_and_stored_when_declared(
    tmp_path: Path,
) -> None:
    """A frame filtered to no rows has an untyped region column; the audit judges it as empty."""

    @ia.audited_asset(
        checks=[ia.row_count(min_rows=0), ia.not_null("trip_id")],
        partitions_def=REGIONS,
        io_manager_key="overwrite_io_manager",
        metadata={"partition_expr": "region", "allow_empty": True},
    )
    def sales(context: dg.AssetExecutionContext) -> pd.DataFrame:
        """No trips in the run's region."""
        frame = region_trips(DAYS[0], context.partition_key)
        return frame[frame["fare"] < 0].assign(region=None)

    db = tmp_path / "w.duckdb"
    run([audited_by_kind(REGIONS)], db, "south")
    result = run([sales], db, "south")
    assert {e.check_name: e.passed for e in result.get_asset_check_evaluations()} == {
        "row_count": True,
        "trip_id_not_null": True,
        "in_window": True,
    }
    with read(db) as conn:
        assert conn.execute("SELECT count(*) FROM sales").fetchall() == [(0,)]
