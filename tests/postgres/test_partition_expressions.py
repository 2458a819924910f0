"""partition_expr expressions on PostgreSQL: the server's SQL must place rows as the guards did.

The guards judge the staged batch with the expression in the embedded DuckDB; the server deletes,
counts and loads with its own spelling of it. Where the two disagree on a value, a rerun would
not delete what the last run wrote, so the publish counts the window on the server before it
commits and refuses a difference. Its PostgreSQL in the C locale lower-cases ASCII only, where
DuckDB lower-cases every letter: the expression is accepted, and the batch refused.
"""

from pathlib import Path

import dagster as dg
import pyarrow as pa
import pytest

import idem_assets as ia
from idem_assets.lib.backends.postgres.backend import PostgresBackend, PostgresLocation
from tests.conformance.conftest import Store, postgres_store

KINDS = dg.StaticPartitionsDefinition(["école", "lycée"])
LOWERED = {"partition_expr": "lower(kind)"}


@pytest.fixture
def pg(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """A fresh PostgreSQL database behind the two IO managers."""
    return postgres_store(request, tmp_path)


def schools(*kinds: str) -> dg.AssetsDefinition:
    """An asset whose rows have ``kinds`` as their 'kind', whatever its partition."""

    @dg.asset(partitions_def=KINDS, metadata=LOWERED)
    def school(context: dg.AssetExecutionContext) -> pa.Table:
        return pa.table({"kind": list(kinds), "pupils": list(range(len(kinds)))})

    return school


def test_a_lowered_key_replaces_its_partition_on_every_rerun(pg: Store) -> None:
    """Where both engines agree (an ASCII capital), the expression scopes it like a column."""
    for _ in range(2):
        assert dg.materialize(
            [schools("Lycée", "lycée")], partition_key="lycée", resources=pg.resources()
        ).success
    assert pg.rows("school") == [("Lycée", 0), ("lycée", 1)]


def test_a_value_the_server_places_elsewhere_is_refused_before_the_commit(
    pg: Store, postgres_location: PostgresLocation
) -> None:
    """DuckDB lowers 'ÉCOLE' to the run's key, the server (C locale) does not: refused."""
    with PostgresBackend.connect(postgres_location) as backend:
        backend.cur.execute("SELECT lower('ÉCOLE')")
        assert backend.cur.fetchall() == [("École",)]
    assert dg.materialize(
        [schools("école")], partition_key="école", resources=pg.resources()
    ).success
    before = pg.snapshot()
    with pytest.raises(ia.StrayRowsError) as refused:
        dg.materialize([schools("ÉCOLE", "école")], partition_key="école", resources=pg.resources())
    message = str(refused.value)
    assert "Postgres places 1 rows in the window by its own evaluation of partition_expr" in message
    assert "where the guards placed 2" in message
    assert "Nothing was changed (the write was rolled back)." in message
    assert (
        "Fix: compute the column in the asset, df['kind_key'] = df['kind'].str.lower()" in message
    )
    assert pg.snapshot() == before
    assert pg.rows("school") == [("école", 0)]
