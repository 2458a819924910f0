"""What the Delta Lake backend does beyond the conformance suite: one commit per publish, the
version in the metadata, loads that read only the window's files, the owner property, the
failures dagster-deltalake is known for, and writers racing in separate processes."""

import json
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pandas as pd
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

import idem_assets as ia
from idem_assets.lib.backends.delta.backend import DeltaBackend
from idem_assets.lib.backends.delta.layout import DAY_COLUMN, owner_of
from tests.conformance import test_first_writers as first
from tests.conformance.conftest import Store, delta_store
from tests.conformance.test_replace_contract import ALL_DAYS, EVENTS, REFUSALS, events
from tests.conformance.test_replace_contract import asset as contract_asset
from tests.conformance.test_replace_contract import fill as contract_fill
from tests.conformance.test_replace_contract import materialize as contract_materialize
from tests.helpers import DAILY, NOW, range_tags, settings, window

REPO = Path(__file__).resolve().parents[2]


def publish(
    root: str, batch: pa.Table, mode: str, *days: str, table: str = "events", **metadata: Any
) -> ia.PublishResult:
    with DeltaBackend(root) as backend:
        return ia.publish(
            backend,
            batch,
            settings(mode, {**EVENTS, **metadata}, table=table),
            window(*days),
            now=NOW,
        )


def fill(root: str, mode: str = "overwrite") -> None:
    for day in ALL_DAYS:
        publish(root, events(day), mode, day)


def stored(root: str, table: str = "events", version: int | None = None) -> list[tuple]:
    found = DeltaTable(f"{root}/main/{table}", version=version).to_pyarrow_table()
    found = found.drop_columns([DAY_COLUMN]) if DAY_COLUMN in found.column_names else found
    return sorted(zip(*found.to_pydict().values(), strict=True))


def expected(*batches: pa.Table) -> list[tuple]:
    both = pa.concat_tables(batches)
    return sorted(zip(*both.to_pydict().values(), strict=True))


def fingerprint(root: str, *days: str) -> str | None:
    with DeltaBackend(root) as backend:
        return ia.table_fingerprint(backend, "main", "events", "event_at", window(*days))


@pytest.mark.parametrize(
    ("mode", "metadata"),
    [
        ("overwrite", {}),
        ("merge", {}),
        ("merge", {"delete_missing": False}),
        ("merge", {"dedupe_order_by": ["amount"]}),
    ],
)
def test_each_publish_is_one_commit_and_its_fingerprint_is_the_stored_window(
    tmp_path: Path, mode: str, metadata: dict[str, Any]
) -> None:
    root = str(tmp_path)
    fill(root, mode)
    version = DeltaTable(f"{root}/main/events").version()
    # Half the day changed, the other half gone: each mode's own result.
    newer = events(ALL_DAYS[1], version=3).slice(0, 500)
    if metadata.get("dedupe_order_by"):
        newer = pa.concat_tables([newer, newer.slice(0, 10)])
    result = publish(root, newer, mode, ALL_DAYS[1], **metadata)

    table = DeltaTable(f"{root}/main/events")
    assert table.version() == version + 1
    assert table.history(1)[0]["operation"] == ("WRITE" if mode == "overwrite" else "MERGE")
    assert result.fingerprint == fingerprint(root, ALL_DAYS[1])
    kept = 500 if metadata.get("delete_missing") is False else 0
    assert result.rows == 500 + kept
    assert fingerprint(root, ALL_DAYS[0]) != fingerprint(root, ALL_DAYS[1])
    assert len(stored(root)) == 2000 + 500 + kept


def test_a_range_publish_is_one_commit_with_each_days_fingerprint(tmp_path: Path) -> None:
    root = str(tmp_path)
    fill(root)
    version = DeltaTable(f"{root}/main/events").version()
    newer = pa.concat_tables([events(d, version=1) for d in ALL_DAYS])
    result = publish(root, newer, "overwrite", *ALL_DAYS)
    assert DeltaTable(f"{root}/main/events").version() == version + 1
    assert {k: p.fingerprint for k, p in result.per_partition.items()} == {
        d: fingerprint(root, d) for d in ALL_DAYS
    }
    assert stored(root) == expected(newer)


def test_the_day_partition_keeps_each_days_rows_in_its_own_files(tmp_path: Path) -> None:
    root = str(tmp_path)
    fill(root)
    table = DeltaTable(f"{root}/main/events")
    assert table.metadata().partition_columns == [DAY_COLUMN]
    days = {p[DAY_COLUMN] for p in table.partitions()}
    assert days == set(ALL_DAYS)


@dg.asset(partitions_def=DAILY, io_manager_key="io_manager", metadata=EVENTS)
def daily_events(context: dg.AssetExecutionContext) -> pa.Table:
    version = int(context.run.tags.get("version", "0"))
    return pa.concat_tables([events(day, version=version) for day in context.partition_keys])


@dg.asset(partitions_def=DAILY, io_manager_key="io_manager", metadata={"partition_expr": "day"})
def day_total(context: dg.AssetExecutionContext, daily_events: pd.DataFrame) -> pd.DataFrame:
    context.add_output_metadata({"columns": list(daily_events.columns)})
    return pd.DataFrame(
        {
            "day": [pd.Timestamp(context.partition_key)],
            "rows": [len(daily_events)],
            "amount": [float(daily_events["amount"].sum())],
        }
    )


def test_load_input_reads_only_the_windows_files_and_the_version_is_in_the_metadata(
    tmp_path: Path,
) -> None:
    root = str(tmp_path / "lake")
    resources = {"io_manager": ia.DeltaOverwriteIOManager(root=root)}
    for day in ALL_DAYS:
        dg.materialize([daily_events], resources=resources, partition_key=day)
    first = dg.materialize([daily_events], resources=resources, partition_key=ALL_DAYS[1])
    published = first.get_asset_materialization_events()[0].materialization.metadata
    version = published["delta_version"].value
    assert published["delta_table_uri"].value == f"{root}/main/daily_events"
    dg.materialize(
        [daily_events], resources=resources, partition_key=ALL_DAYS[1], tags={"version": "4"}
    )
    # Time travel to the version the first run published gives exactly what it wrote.
    assert stored(root, "daily_events", version) == expected(*(events(d) for d in ALL_DAYS))

    # Another day's files gone: a load of this day never opens them.
    table = DeltaTable(f"{root}/main/daily_events")
    for uri in table.file_uris(file_pruning_predicate=[(DAY_COLUMN, "=", ALL_DAYS[0])]):
        Path(uri).unlink()
    result = dg.materialize(
        [daily_events.to_source_asset(), day_total],
        resources=resources,
        partition_key=ALL_DAYS[1],
    )
    total = result.get_asset_materialization_events()[0].materialization.metadata
    assert total["columns"].value == ["event_id", "event_at", "amount"]
    newer = events(ALL_DAYS[1], version=4)
    totals = stored(root, "day_total")
    assert totals == [
        (datetime.fromisoformat(ALL_DAYS[1]), 1000, sum(newer.column("amount").to_pylist()))
    ]


def region_events(region: str) -> dg.AssetsDefinition:
    @dg.asset(
        name="events",
        key_prefix=[region],
        partitions_def=DAILY,
        io_manager_key="io_manager",
        metadata=EVENTS,
    )
    def compute(context: dg.AssetExecutionContext) -> pa.Table:
        return events(context.partition_key)

    return compute


def test_a_table_of_another_asset_is_refused_and_the_printed_handover_works(
    tmp_path: Path,
) -> None:
    root = str(tmp_path)
    # One schema for every asset: us/events and eu/events both resolve to main.events.
    resources = {"io_manager": ia.DeltaOverwriteIOManager(root=root, schema="main")}
    dg.materialize([region_events("us")], resources=resources, partition_key=ALL_DAYS[0])
    table = DeltaTable(f"{root}/main/events")
    assert owner_of(table) == "us/events"
    version = table.version()
    with pytest.raises(ia.ConfigurationError) as refused:
        dg.materialize([region_events("eu")], resources=resources, partition_key=ALL_DAYS[0])
    text = str(refused.value)
    assert "table main.events belongs to asset 'us/events'" in text
    assert DeltaTable(f"{root}/main/events").version() == version

    handover = re.search(r"hand the table over first: (deltalake\..*)\.$", text)
    assert handover is not None
    exec(handover[1], {"deltalake": __import__("deltalake")})
    dg.materialize([region_events("eu")], resources=resources, partition_key=ALL_DAYS[0])
    assert owner_of(DeltaTable(f"{root}/main/events")) == "eu/events"


def run_handover(message: str) -> None:
    """Run the handover a refusal of an unowned table prints, exactly as printed."""
    handover = re.search(
        r"hand it over once: (deltalake\.DeltaTable\(.*?\)\.alter\..*?\)) ", message
    )
    assert handover is not None, message
    exec(handover[1], {"deltalake": __import__("deltalake")})


VISITS = {"partition_expr": "day", "primary_key": ["visit_id"]}


def visits_rows(day: str, version: int = 0, tip: bool = False) -> pa.Table:
    """Three visits of ``day``, as another tool's table holds them (a DATE column ``day``)."""
    base = int(day.replace("-", "")) * 10
    found = pa.table(
        {
            "visit_id": pa.array([base + i for i in range(3)], pa.int64()),
            "day": pa.array([date.fromisoformat(day)] * 3, pa.date32()),
            "n": pa.array([version] * 3, pa.int64()),
        }
    )
    return found.append_column("tip", pa.array([0.5] * 3)) if tip else found


def visits_asset(metadata: dict[str, Any], io_manager: str, tip: bool) -> dg.AssetsDefinition:
    @dg.asset(name="visits", partitions_def=DAILY, io_manager_key=io_manager, metadata=metadata)
    def visits(context: dg.AssetExecutionContext) -> pa.Table:
        return visits_rows(context.partition_key, version=1, tip=tip)

    return visits


@pytest.mark.parametrize(
    ("io_manager", "metadata", "tip"),
    [
        ("io_manager", VISITS, False),
        ("merge_io_manager", VISITS, False),
        ("merge_io_manager", {**VISITS, "schema_evolution": "add_columns"}, True),
    ],
    ids=["overwrite", "merge", "merge-add-columns"],
)
def test_a_table_another_tool_made_is_handed_over_then_written_in_its_own_layout(
    tmp_path: Path, io_manager: str, metadata: dict[str, Any], tip: bool
) -> None:
    """dagster-deltalake's layout (partitioned by the DATE column itself, a name of its own)."""
    root = str(tmp_path / "lake")
    uri = f"{root}/main/visits"
    theirs = pa.concat_tables([visits_rows(ALL_DAYS[0]), visits_rows(ALL_DAYS[1])])
    write_deltalake(uri, theirs, partition_by=["day"], name="team_visits")
    resources = {
        "io_manager": ia.DeltaOverwriteIOManager(root=root),
        "merge_io_manager": ia.DeltaMergeIOManager(root=root),
    }
    visits = visits_asset(metadata, io_manager, tip)
    before = files_of(root)

    with pytest.raises(ia.ConfigurationError, match="exists, but no asset owns it") as refused:
        dg.materialize([visits], resources=resources, partition_key=ALL_DAYS[1])
    assert files_of(root) == before
    assert DeltaTable(uri).metadata().name == "team_visits"

    run_handover(str(refused.value))
    for _ in range(2):
        dg.materialize([visits], resources=resources, partition_key=ALL_DAYS[1])
    table = DeltaTable(uri)
    assert owner_of(table) == "visits"
    assert table.metadata().partition_columns == ["day"]
    columns = ["visit_id", "day", "n", *(["tip"] if tip else [])]
    # By name: delta-rs moves the partition column last when it merges a schema.
    assert sorted(pa.schema(table.schema().to_arrow()).names) == sorted(columns)  # type: ignore[arg-type]
    found = table.to_pyarrow_table().select(columns)
    kept = visits_rows(ALL_DAYS[0])
    if tip:
        kept = kept.append_column("tip", pa.array([None] * 3, pa.float64()))
    assert expected(found) == expected(kept, visits_rows(ALL_DAYS[1], 1, tip))


def test_a_merge_that_adds_a_column_is_one_commit_that_keeps_the_owner(tmp_path: Path) -> None:
    """delta-rs's schema-merging MERGE drops the table's name, where the owner is recorded."""
    root = str(tmp_path)
    fill(root, "merge")
    version = DeltaTable(f"{root}/main/events").version()
    tipped = events(ALL_DAYS[1], version=1).slice(0, 600)
    tipped = tipped.append_column("tip", pa.array([0.5] * 600))
    result = publish(
        root, tipped, "merge", ALL_DAYS[1], schema_evolution="add_columns", delete_missing=False
    )

    table = DeltaTable(f"{root}/main/events")
    assert (table.version(), owner_of(table)) == (version + 1, "events")
    kept = events(ALL_DAYS[1]).slice(600).append_column("tip", pa.array([None] * 400, pa.float64()))
    others = [
        events(d).append_column("tip", pa.array([None] * 1000, pa.float64()))
        for d in (ALL_DAYS[0], ALL_DAYS[2])
    ]
    assert stored(root) == expected(others[0], tipped, kept, others[1])
    assert result.fingerprint == fingerprint(root, ALL_DAYS[1])
    assert (result.rows, result.inserted, result.updated) == (1000, 0, 600)


# dagster-io/dagster#34064 and the range run: replayed on the column types that broke them ------


def day_rows(day: str, kind: str, version: int = 0, rows: int = 100) -> pa.Table:
    start = datetime.fromisoformat(day)
    base = int(start.strftime("%Y%m%d")) * 1000
    stamps = [start + timedelta(minutes=10 * i) for i in range(rows)]
    column = {
        "date": pa.array([s.date() for s in stamps], pa.date32()),
        "timestamp": pa.array(stamps, pa.timestamp("us")),
        "timestamptz": pa.array([s.astimezone() for s in stamps], pa.timestamp("us", "UTC")),
    }[kind]
    return pa.table(
        {
            "id": pa.array([base + i for i in range(rows)], pa.int64()),
            "at": column,
            "value": pa.array([float(i + version) for i in range(rows)]),
        }
    )


def replay(root: str, kind: str, batch: pa.Table, *days: str) -> None:
    with DeltaBackend(root) as backend:
        ia.publish(
            backend,
            batch,
            settings("overwrite", {"partition_expr": "at"}, table="events"),
            window(*days),
            now=NOW,
        )


@pytest.mark.parametrize("kind", ["date", "timestamp", "timestamptz"])
def test_one_day_never_becomes_a_whole_table_overwrite(tmp_path: Path, kind: str) -> None:
    """dagster-io/dagster#34064: two days wiped and a stray row kept, on a TIMESTAMP column."""
    root = str(tmp_path)
    for day in ALL_DAYS:
        replay(root, kind, day_rows(day, kind), day)
    newer = day_rows(ALL_DAYS[1], kind, version=1)
    replay(root, kind, newer, ALL_DAYS[1])
    assert stored(root) == expected(day_rows(ALL_DAYS[0], kind), newer, day_rows(ALL_DAYS[2], kind))

    stray = pa.concat_tables([newer, day_rows(ALL_DAYS[2], kind, rows=1)])
    with pytest.raises(ia.StrayRowsError):
        replay(root, kind, stray, ALL_DAYS[1])
    assert stored(root) == expected(day_rows(ALL_DAYS[0], kind), newer, day_rows(ALL_DAYS[2], kind))


@pytest.mark.parametrize("kind", ["date", "timestamp"])
def test_a_range_run_replaces_every_day_of_its_range(tmp_path: Path, kind: str) -> None:
    """A DATE-column range run whose predicate covered only its first day."""
    root = str(tmp_path)
    replay(root, kind, pa.concat_tables([day_rows(d, kind) for d in ALL_DAYS]), *ALL_DAYS)
    newer = pa.concat_tables([day_rows(d, kind, version=2) for d in ALL_DAYS])
    replay(root, kind, newer, *ALL_DAYS)
    assert stored(root) == expected(newer)
    predicate = DeltaTable(f"{root}/main/events").history(1)[0]["operationParameters"]
    last = date.fromisoformat(ALL_DAYS[-1]) + timedelta(days=1)
    assert f"'{last.isoformat()}" in predicate["predicate"]


def test_a_range_run_through_dagster_replaces_every_day(tmp_path: Path) -> None:
    root = str(tmp_path)
    resources = {"io_manager": ia.DeltaOverwriteIOManager(root=root)}
    for day in ALL_DAYS:
        dg.materialize([daily_events], resources=resources, partition_key=day)
    dg.materialize(
        [daily_events],
        resources=resources,
        tags={**range_tags(ALL_DAYS[0], ALL_DAYS[-1]), "version": "6"},
    )
    assert stored(root, "daily_events") == expected(*(events(d, version=6) for d in ALL_DAYS))


# Writers in separate processes ---------------------------------------------------------------


def start_writer(root: str, day: str, version: int, barrier: Path, parties: int) -> Any:
    args = [root, day, str(version), str(barrier), str(parties)]
    return subprocess.Popen(
        [sys.executable, "-m", "tests.delta.writer", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )


def outcome(process: Any) -> dict[str, Any]:
    out, _ = process.communicate(timeout=120)
    return json.loads(out.strip().splitlines()[-1])


def race(root: str, barrier: Path, writers: list[tuple[str, int]]) -> list[dict[str, Any]]:
    """Writers that all decide on one table version, then commit at once."""
    processes = [start_writer(root, day, v, barrier, len(writers)) for day, v in writers]
    return [outcome(p) for p in processes]


def first_writers_of_one_day(store: Store, options: dict[str, str] | None = None) -> None:
    """Two processes create one table with one day at once: each reports the version it wrote.

    The loser of the creation starts over on the winner's table, so the versions are 0 and 1,
    and each writer's version holds exactly its own batch in the day.
    """
    writers = [(first.DAY, 1, "plain"), (first.DAY, 2, "plain")]
    for i in range(first.RACES):
        results = first.race(store, f"events_{i}", "overwrite", writers)
        assert [r[0] for r in results] == ["committed", "committed"], results
        uri = f"{store.config['root']}/main/events_{i}"
        versions = {}
        for writer, (_, _, metadata) in zip(writers, results, strict=True):
            assert metadata["delta_table_uri"] == uri
            version = metadata["delta_version"]
            at = DeltaTable(uri, version=version, storage_options=options).to_pyarrow_table()
            versions[version] = sorted(
                zip(*at.drop_columns([DAY_COLUMN]).to_pydict().values(), strict=True)
            )
            assert versions[version] == first.rows_of([writer]), f"version {version}: {results}"
        assert sorted(versions) == [0, 1], results
        assert DeltaTable(uri, storage_options=options).version() == 1


@pytest.mark.slow
def test_first_writers_of_a_new_table_report_the_versions_they_committed(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    first_writers_of_one_day(delta_store(request, tmp_path))


@pytest.mark.parametrize("existing", [True, False], ids=["table exists", "new table"])
def test_writers_of_different_days_both_commit(tmp_path: Path, existing: bool) -> None:
    root = str(tmp_path)
    if existing:
        publish(root, events(ALL_DAYS[0]), "overwrite", ALL_DAYS[0])
    found = race(root, tmp_path / "barrier", [(ALL_DAYS[1], 1), (ALL_DAYS[2], 2)])
    assert [f["outcome"] for f in found] == ["committed", "committed"], found
    # Different days touch different files: no retry. Both creating the table, one creation
    # wins and the other publish starts over on that table, with the winner's day in it.
    assert sorted(f["attempts"] for f in found) == ([1, 1] if existing else [1, 2])
    kept = [events(ALL_DAYS[0])] if existing else []
    assert stored(root) == expected(
        *kept, events(ALL_DAYS[1], version=1), events(ALL_DAYS[2], version=2)
    )


def test_writers_of_one_day_leave_exactly_one_batch(tmp_path: Path) -> None:
    root = str(tmp_path)
    fill(root)
    found = race(root, tmp_path / "barrier", [(ALL_DAYS[1], 1), (ALL_DAYS[1], 2)])
    assert all(f["outcome"] == "committed" for f in found), found
    # Both decided on one version: the second commit conflicted and started over on the first's.
    assert sorted(f["attempts"] for f in found) == [1, 2]
    day = [r for r in stored(root) if r[1].date().isoformat() == ALL_DAYS[1]]
    assert day in (
        expected(events(ALL_DAYS[1], version=1)),
        expected(events(ALL_DAYS[1], version=2)),
    )
    assert len(stored(root)) == 3000


def test_a_commit_that_keeps_losing_is_refused_after_its_attempts(tmp_path: Path) -> None:
    root = str(tmp_path)
    fill(root)
    others: list[int] = []

    def another_writer_commits_first(stage: str) -> None:
        # Each attempt, another process commits the same day before this one can.
        if stage == "before_commit":
            others.append(len(others) + 10)
            found = outcome(start_writer(root, ALL_DAYS[1], others[-1], tmp_path / "b", 1))
            assert found["outcome"] == "committed"

    with DeltaBackend(root) as backend, pytest.raises(ia.ConcurrentWriteError) as refused:
        ia.publish(
            backend,
            events(ALL_DAYS[1], version=1),
            settings("overwrite", EVENTS, table="events"),
            window(ALL_DAYS[1]),
            now=NOW,
            on_stage=another_writer_commits_first,
        )
    assert len(others) == 3
    text = str(refused.value)
    assert text.startswith(f"Refused to write asset 'events', partition {ALL_DAYS[1]}: 3 attempts")
    assert "Nothing was changed. Fix:" in text
    # Not doubled, not lost: the day holds exactly the last other writer's batch.
    assert stored(root) == expected(
        events(ALL_DAYS[0]), events(ALL_DAYS[1], version=others[-1]), events(ALL_DAYS[2])
    )


# Types: the schema fit with Delta's dialect ---------------------------------------------------


def test_a_new_table_stores_deltas_types_and_later_batches_fit_them(tmp_path: Path) -> None:
    root = str(tmp_path)
    day = ALL_DAYS[0]
    start = datetime.fromisoformat(day)
    nanos = int(start.replace(tzinfo=UTC).timestamp()) * 10**9
    first = pa.table(
        {
            "event_id": pa.array([1, 2], pa.uint32()),
            # The second one 1,500 nanoseconds after the first.
            "event_at": pa.array([nanos, nanos + 1500], pa.int64()).cast(pa.timestamp("ns")),
            "amount": pa.array([1.0, 2.0], pa.float32()),
        }
    )
    publish(root, first, "overwrite", day)
    table = DeltaTable(f"{root}/main/events")
    stored_types = {f.name: f.type for f in pa.schema(table.schema().to_arrow())}
    assert stored_types == {
        "event_id": pa.int64(),
        "event_at": pa.timestamp("us"),
        "amount": pa.float32(),
        DAY_COLUMN: pa.date32(),
    }
    # Nanoseconds floored to the stored microseconds.
    assert stored(root) == [(1, start, 1.0), (2, start + timedelta(microseconds=1), 2.0)]

    narrower = first.set_column(0, "event_id", pa.array([1, 2], pa.int16()))
    publish(root, narrower, "overwrite", day)
    assert len(stored(root)) == 2

    drifted = first.set_column(2, "amount", pa.array(["1", "2"]))
    with pytest.raises(ia.SchemaMismatchError) as refused:
        publish(root, drifted, "overwrite", day)
    text = str(refused.value)
    assert "types that cannot hold every batch value [amount: table FLOAT, batch STRING]" in text
    assert "d['amount'].cast(pyarrow.string())" in text
    assert len(stored(root)) == 2


def run_migration(message: str) -> None:
    """Run the migration a schema refusal prints, exactly as printed."""
    found = re.search(
        r"(?:migrate the table first, then rerun|a rewrite of every row, in one"
        r" commit): (.*?)(?:\.$|\) and set)",
        message,
    )
    assert found is not None, message
    exec(found[1], {"deltalake": __import__("deltalake")})


def retyped(batch: pa.Table, column: str, values: pa.Array) -> pa.Table:
    return batch.set_column(batch.schema.get_field_index(column), column, values)


@pytest.mark.parametrize(
    ("change", "metadata"),
    [
        ("extra", {}),
        ("missing", {}),
        ("retyped", {}),
        ("widened", {"schema_evolution": "widen_types"}),
    ],
)
def test_a_printed_migration_runs_as_printed_and_then_the_batch_fits(
    tmp_path: Path, change: str, metadata: dict[str, Any]
) -> None:
    """delta-rs runs no ALTER TABLE: the migration printed is deltalake's API, run here."""
    root = str(tmp_path)
    narrow = [retyped(events(d), "amount", pa.array(range(1000), pa.int32())) for d in ALL_DAYS]
    for day, batch in zip(ALL_DAYS, narrow, strict=True):
        publish(root, batch, "overwrite", day)
    newer = {
        "extra": narrow[1].append_column("tip", pa.array([0.5] * 1000)),
        "missing": narrow[1].drop_columns(["amount"]),
        "retyped": retyped(narrow[1], "amount", pa.array([f"{i}.5" for i in range(1000)])),
        "widened": retyped(narrow[1], "amount", pa.array(range(1000), pa.int64())),
    }[change]
    with pytest.raises(ia.SchemaMismatchError) as refused:
        publish(root, newer, "overwrite", ALL_DAYS[1], **metadata)
    run_migration(str(refused.value))
    publish(root, newer, "overwrite", ALL_DAYS[1], **metadata)

    table = DeltaTable(f"{root}/main/events")
    assert owner_of(table) == "events"
    assert table.metadata().partition_columns == [DAY_COLUMN]
    found = table.to_pyarrow_table().select(newer.column_names)
    assert found.schema.remove_metadata() == newer.schema
    if change == "extra":
        kept = [b.append_column("tip", pa.nulls(1000, pa.float64())) for b in narrow[::2]]
    else:
        kept = [b.select(newer.column_names) for b in narrow[::2]]
    if change in ("retyped", "widened"):
        amount = newer.schema.field("amount").type
        kept = [retyped(b, "amount", b["amount"].cast(amount)) for b in kept]
    assert expected(found) == expected(kept[0], newer, kept[1])


# Windows finer than the day partition ---------------------------------------------------------

HOURLY = dg.HourlyPartitionsDefinition(start_date="2026-01-01-00:00")


def hour_rows(hour: int, version: int = 0) -> pa.Table:
    start = datetime(2026, 1, 1, hour)
    return pa.table(
        {
            "event_id": pa.array([hour * 100 + i for i in range(6)], pa.int64()),
            "event_at": pa.array([start + timedelta(minutes=10 * i) for i in range(6)]),
            "amount": pa.array([float(version)] * 6),
        }
    )


def publish_hours(root: str, batch: pa.Table, *hours: int) -> ia.PublishResult:
    keys = [f"2026-01-01-{h:02d}:00" for h in hours]
    with DeltaBackend(root) as backend:
        return ia.publish(
            backend,
            batch,
            settings("overwrite", EVENTS, table="events"),
            window(*keys, partitions=HOURLY),
            now=NOW,
        )


def test_an_hour_inside_a_days_files_is_counted_and_replaced_alone(tmp_path: Path) -> None:
    """Files holding several hours straddle the window: their rows are read, not their stats."""
    root = str(tmp_path)
    publish_hours(root, pa.concat_tables([hour_rows(h) for h in (1, 2, 3)]), 1, 2, 3)
    result = publish_hours(root, hour_rows(2, version=1), 2)
    assert (result.rows, result.inserted, result.deleted) == (6, 6, 6)
    assert stored(root) == expected(hour_rows(1), hour_rows(2, version=1), hour_rows(3))

    with pytest.raises(ia.EmptyBatchError, match="the window holds 6 rows"):
        publish_hours(root, hour_rows(2).slice(0, 0), 2)


def files_of(root: str) -> dict[str, int]:
    """Every file under ``root`` with its size: what "byte-identical" means for a lake."""
    return {
        str(p.relative_to(root)): p.stat().st_size for p in Path(root).rglob("*") if p.is_file()
    }


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_a_refusal_writes_no_file_and_no_version(
    request: pytest.FixtureRequest, tmp_path: Path, case: str
) -> None:
    """The commit is held back until every guard passed: a refused batch leaves no trace."""
    source, io_manager, _ = REFUSALS[case]
    store = delta_store(request, tmp_path)
    contract_fill(store, io_manager)
    before = files_of(str(tmp_path / "lake"))
    result = contract_materialize(
        store, [contract_asset(source, io_manager=io_manager)], ALL_DAYS[1], raise_on_error=False
    )
    assert not result.success
    assert files_of(str(tmp_path / "lake")) == before


def test_a_widening_the_asset_opted_into_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    """delta-rs cannot change a column's type in a write: the refusal says how to do it once."""
    root = str(tmp_path / "lake")
    narrow = events(ALL_DAYS[0]).set_column(2, "amount", pa.array(range(1000), pa.int32()))
    publish(root, narrow, "overwrite", ALL_DAYS[0])
    before = (fingerprint(root, ALL_DAYS[0]), DeltaTable(f"{root}/main/events").version())
    wide = narrow.set_column(2, "amount", pa.array(range(1000), pa.int64()))

    with pytest.raises(ia.SchemaMismatchError, match="cannot change a column's type") as refused:
        publish(root, wide, "overwrite", ALL_DAYS[0], schema_evolution="widen_types")
    assert "amount: table int32, batch int64" in str(refused.value)
    assert "Nothing was changed" in str(refused.value)
    after = (fingerprint(root, ALL_DAYS[0]), DeltaTable(f"{root}/main/events").version())
    assert after == before
    # Added columns still evolve on Delta, in the write's own commit.
    tipped = narrow.append_column("tip", pa.array([0.5] * 1000))
    publish(root, tipped, "overwrite", ALL_DAYS[0], schema_evolution="add_columns")
    assert DeltaTable(f"{root}/main/events").version() == before[1] + 1
    assert {row[3] for row in stored(root)} == {0.5}


def test_an_append_only_table_refuses_removals_at_once_and_the_printed_lift_works(
    tmp_path: Path,
) -> None:
    """delta.appendOnly refuses every commit that removes a file: no retry can change that."""
    root = str(tmp_path)
    fill(root)
    DeltaTable(f"{root}/main/events").alter.set_table_properties({"delta.appendOnly": "true"})
    version = DeltaTable(f"{root}/main/events").version()
    attempts: list[str] = []

    def count(stage: str) -> None:
        attempts.append(stage)

    newer = events(ALL_DAYS[1], version=1)
    for mode, metadata, removal in [
        ("overwrite", {}, "an overwrite replaces the window's files"),
        ("merge", {}, "this merge updates 1000 and deletes 0 stored row(s)"),
        ("merge", {"delete_missing": True}, "updates 500 and deletes 500 stored row(s)"),
    ]:
        batch = newer if "500" not in removal else newer.slice(0, 500)
        with DeltaBackend(root) as backend, pytest.raises(ia.ConfigurationError) as refused:
            ia.publish(
                backend,
                batch,
                settings(mode, {**EVENTS, **metadata}, table="events"),
                window(ALL_DAYS[1]),
                now=NOW,
                on_stage=count,
            )
        assert "table main.events is append-only (delta.appendOnly), and Delta Lake" in str(
            refused.value
        )
        assert removal in str(refused.value)
    assert attempts == [] and DeltaTable(f"{root}/main/events").version() == version

    # New keys only: a merge that removes nothing is an append, which the table takes.
    added = events(ALL_DAYS[1], version=2).set_column(
        0, "event_id", pa.array(range(1000), pa.int64())
    )
    publish(root, added, "merge", ALL_DAYS[1], delete_missing=False)
    assert len(stored(root)) == 4000

    lift = re.search(r"lift the property once: (deltalake\..*?\}\));", str(refused.value))
    assert lift is not None
    exec(lift[1], {"deltalake": __import__("deltalake")})
    publish(root, newer, "overwrite", ALL_DAYS[1])
    assert stored(root) == expected(events(ALL_DAYS[0]), newer, events(ALL_DAYS[2]))


# What delta-rs refuses at the commit: named, with the fix, as a test runs it --------------------


@pytest.mark.parametrize("mode", ["overwrite", "merge"])
def test_rows_a_check_constraint_refuses_are_named_and_the_printed_drop_works(
    tmp_path: Path, mode: str
) -> None:
    root = str(tmp_path)
    fill(root, mode)
    DeltaTable(f"{root}/main/events").alter.add_constraint({"amount_small": "amount < 100"})
    version = DeltaTable(f"{root}/main/events").version()
    # Amounts are i % 97 + 5: the 20 rows with i % 97 of 95 or 96 reach 100.
    newer = events(ALL_DAYS[1], version=5)
    with pytest.raises(ia.ConstraintViolationError) as refused:
        publish(root, newer, mode, ALL_DAYS[1])
    text = str(refused.value)
    assert text.startswith(
        f"Refused to write asset 'events', partition {ALL_DAYS[1]}: 20 row(s) of the batch break"
        " the table's constraints [CHECK amount_small (amount < 100)]"
    )
    assert "| 202601020095 | 2026-01-02T02:06:40 | 100.0" in text
    assert "__delta_rs" not in text
    assert DeltaTable(f"{root}/main/events").version() == version

    drop = re.search(r"drop it: (deltalake\..*?\)). Sample:", text)
    assert drop is not None
    exec(drop[1], {"deltalake": __import__("deltalake")})
    publish(root, newer, mode, ALL_DAYS[1])
    assert stored(root) == expected(events(ALL_DAYS[0]), newer, events(ALL_DAYS[2]))


@pytest.mark.parametrize("damage", ["last-entry-cut-short", "entry-missing"])
def test_a_damaged_log_entry_is_named_with_its_fix(tmp_path: Path, damage: str) -> None:
    """Each day's publish is one log entry: entry 2 cut short, or entry 1 gone."""
    root = str(tmp_path)
    fill(root)
    log = Path(root, "main", "events", "_delta_log")
    entry = log / f"{2 if damage == 'last-entry-cut-short' else 1:020d}.json"
    whole = entry.read_bytes()
    if damage == "last-entry-cut-short":
        entry.write_bytes(whole[: len(whole) // 2])
    else:
        entry.unlink()
    newer = events(ALL_DAYS[1], version=1)
    with pytest.raises(ia.StorageError) as refused:
        publish(root, newer, "overwrite", ALL_DAYS[1])
    text = str(refused.value)
    assert f"the Delta log of table main.events ({log}) cannot be read" in text
    assert f"Fix: restore {entry} from a backup" in text

    if damage == "last-entry-cut-short":
        assert "log entry 00000000000000000002.json is cut short or not JSON" in text
        removal = re.search(r"deleting it \((os\.remove\(.*?\))\)", text)
        assert removal is not None
        exec(removal[1], {"os": __import__("os")})
        # Back at version 1: the third day's commit is gone, and its partition is rerun.
        publish(root, events(ALL_DAYS[2]), "overwrite", ALL_DAYS[2])
    else:
        assert "log entry 00000000000000000001.json is missing" in text
        assert "deleting it" not in text
        entry.write_bytes(whole)
    publish(root, newer, "overwrite", ALL_DAYS[1])
    assert stored(root) == expected(events(ALL_DAYS[0]), newer, events(ALL_DAYS[2]))


@pytest.fixture
def immutable(tmp_path: Path) -> Iterator[Callable[[Path], None]]:
    """Make a path immutable (chattr +i: root ignores permission bits); undone after the test."""
    made: list[Path] = []

    def make(path: Path) -> None:
        if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode:
            pytest.skip("chattr +i needs root and a file system with attributes")
        made.append(path)

    yield make
    for path in made:
        subprocess.run(["chattr", "-i", str(path)], capture_output=True)


@pytest.mark.parametrize("where", ["log", "schema"], ids=["log-of-a-table", "schema-of-a-new-one"])
def test_storage_the_publish_may_not_write_is_named_with_its_fix(
    tmp_path: Path, immutable: Callable[[Path], None], where: str
) -> None:
    root = str(tmp_path / "lake")
    fill(root)
    newer = events(ALL_DAYS[1], version=1)
    table = "events" if where == "log" else "other"
    immutable(Path(root, "main", "events", "_delta_log") if where == "log" else Path(root, "main"))
    with pytest.raises(ia.StorageError) as refused:
        publish(root, newer, "overwrite", ALL_DAYS[1], table=table)
    text = str(refused.value)
    path = (
        f"{root}/main/events/_delta_log/{3:020d}.json" if where == "log" else f"{root}/main/other"
    )
    assert f"Delta Lake may not write {path}: operation not permitted. Nothing was changed" in text
    assert stored(root) == expected(*(events(d) for d in ALL_DAYS))

    command = re.search(r"an immutable file or directory: (chattr .*?)\)", text)
    assert command is not None
    subprocess.run(shlex.split(command[1]), check=True)
    publish(root, newer, "overwrite", ALL_DAYS[1], table=table)
    if table == "events":
        assert stored(root) == expected(events(ALL_DAYS[0]), newer, events(ALL_DAYS[2]))
    else:
        assert stored(root, "other") == expected(newer)
