"""An input reads exactly the upstream partitions it maps to, and refuses ones never written."""

from pathlib import Path
from typing import Any

import dagster as dg
import pandas as pd
import pytest

import idem_assets as ia
from tests.helpers import range_tags

from .support import DAILY, DAYS, read, resources, rows, trips

UP: dict[str, Any] = {"partition_expr": "pickup_at"}


def pipeline(up_rows: int = 10) -> list[dg.AssetsDefinition]:
    """``up`` writes ``up_rows`` trips a day; ``down`` keeps the ones with 4+ passengers."""

    @dg.asset(partitions_def=DAILY, io_manager_key="io_manager", metadata=UP)
    def up(context: dg.AssetExecutionContext) -> pd.DataFrame:
        """Trips as delivered."""
        return trips(context.partition_key).iloc[:up_rows]

    @dg.asset(
        partitions_def=DAILY,
        io_manager_key="io_manager",
        metadata={**UP, "allow_empty": True},
    )
    def down(up: pd.DataFrame) -> pd.DataFrame:
        """Busy trips."""
        return up[up["passenger_count"] >= 4]

    return [up, down]


def materialize(
    assets: list[dg.AssetsDefinition],
    db: Path,
    instance: dg.DagsterInstance,
    selection: str,
    partition: str | None = None,
    partition_range: tuple[str, str] | None = None,
) -> dg.ExecuteInProcessResult:
    tags = {}
    if partition_range:
        tags = range_tags(partition_range[0], partition_range[1])
    return dg.materialize(
        assets,
        resources=resources(db),
        instance=instance,
        partition_key=partition,
        tags=tags,
        selection=[selection],
    )


@pytest.fixture
def instance() -> dg.DagsterInstance:
    with dg.instance_for_test() as instance:
        yield instance


def test_a_never_materialised_upstream_partition_is_refused(
    tmp_path: Path, instance: dg.DagsterInstance
) -> None:
    db = tmp_path / "w.duckdb"
    assets = pipeline()
    materialize(assets, db, instance, "up", DAYS[0])
    materialize(assets, db, instance, "down", DAYS[0])
    with read(db) as conn:
        before = rows(conn, "down")

    with pytest.raises(ia.MissingUpstreamError) as refused:
        materialize(assets, db, instance, "down", DAYS[1])

    message = str(refused.value)
    assert "Refused to load asset 'up' for 'down': partition(s) ['2026-01-02']" in message
    assert "Nothing was changed. Fix: materialise 'up' for those partition(s) first" in message
    with read(db) as conn:
        assert rows(conn, "down") == before
        assert len(before) == 4


def test_a_range_names_only_its_missing_partitions(
    tmp_path: Path, instance: dg.DagsterInstance
) -> None:
    db = tmp_path / "w.duckdb"
    assets = pipeline()
    materialize(assets, db, instance, "up", DAYS[1])

    with pytest.raises(ia.MissingUpstreamError, match=r"\['2026-01-01', '2026-01-03'\]"):
        materialize(assets, db, instance, "down", partition_range=(DAYS[0], DAYS[2]))


def test_an_upstream_partition_materialised_empty_is_read_as_empty(
    tmp_path: Path, instance: dg.DagsterInstance
) -> None:
    db = tmp_path / "w.duckdb"
    materialize(pipeline(), db, instance, "up", DAYS[0])
    empty = pipeline(up_rows=0)
    materialize(empty, db, instance, "up", DAYS[1])

    result = materialize(empty, db, instance, "down", DAYS[1])
    again = materialize(empty, db, instance, "down", DAYS[1])

    assert result.success and again.success
    (event,) = again.get_asset_materialization_events()
    assert event.materialization.metadata["dagster/row_count"].value == 0


def test_rows_written_under_another_instance_count_as_materialised(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    assets = pipeline()
    with dg.instance_for_test() as first:
        materialize(assets, db, first, "up", DAYS[1])
    with dg.instance_for_test() as second:
        result = materialize(assets, db, second, "down", DAYS[1])
    assert result.success
    with read(db) as conn:
        assert len(rows(conn, "down")) == 4
