"""What PostgreSQL cannot store, refused before the server sees a row, with a fix that works.

Each case materialises an asset through the Postgres IO managers: the run fails with the
library's message (never the server's raw error), the database is exactly as it was, and the
fix the message prints, applied as printed, lets the rerun succeed. docs/bad-inputs.md lists
every case with its message (its PostgreSQL section).
"""

import re
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import dagster as dg
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from postgres_server import PostgresServer

import idem_assets as ia
from idem_assets.lib.backends.postgres.backend import PostgresLocation
from tests.conformance.conftest import Store, postgres_store
from tests.helpers import DAILY, NOW, settings, window

DAY = "2026-01-02"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "bad-inputs.md"
TRIPS: dict[str, Any] = {"partition_expr": "pickup_at", "primary_key": ["trip_id"]}
#: 33 characters, 64 bytes of UTF-8: one byte more than a PostgreSQL name holds.
LONG = "ü" * 31 + "xa"
#: The same name cut to 63 bytes, as the refusal advises.
SHORT = "ü" * 31 + "x"
#: The session time zone printed statements run in: a migration must not depend on it.
OTHER_ZONE = "Asia/Tokyo"


@pytest.fixture
def pg(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """A fresh PostgreSQL database behind the two IO managers."""
    return postgres_store(request, tmp_path)


def trips(**columns: pa.Array) -> pa.Table:
    """Two trips of DAY, plus ``columns``."""
    base = {
        "trip_id": pa.array([1, 2], pa.int64()),
        "pickup_at": pa.array([datetime(2026, 1, 2, 1), datetime(2026, 1, 2, 2)]),
    }
    return pa.table({**base, **columns})


def asset(
    batch: Callable[[], pa.Table],
    name: str = "trips",
    metadata: dict[str, Any] | None = None,
    partitions_def: dg.PartitionsDefinition = DAILY,
) -> dg.AssetsDefinition:
    @dg.asset(name=name, partitions_def=partitions_def, metadata=metadata or TRIPS)
    def compute() -> pa.Table:
        return batch()

    return compute


def run(pg: Store, definition: dg.AssetsDefinition, day: str = DAY) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        [definition], resources=pg.resources(), partition_key=day, raise_on_error=False
    )


def run_as_printed(pg: Store, statement: str) -> None:
    """Run a statement a message printed, in a session whose time zone is not UTC."""
    with pg.open() as backend:
        backend.cur.execute(f"SET TimeZone = '{OTHER_ZONE}'")
        backend.cur.execute(statement)
        backend.conn.commit()


def printed_migration(text: str) -> str:
    """The statement(s) a schema refusal prints after 'then rerun: '."""
    found = re.search(r"then rerun: (.*?)(?:; or |\.(?:\s|$))", text)
    assert found, text
    return found[1]


def failure(result: dg.ExecuteInProcessResult) -> str:
    """The failed step's error chain: each error's class and message."""
    assert not result.success
    (event,) = [e for e in result.all_events if e.is_step_failure]
    error = event.step_failure_data.error if event.step_failure_data else None
    parts = []
    while error is not None:
        parts.append(f"{error.cls_name}: {error.message}")
        error = error.cause
    return "\n".join(parts)


def refused(
    pg: Store,
    definition: dg.AssetsDefinition,
    error: str,
    *fragments: str,
    snapshot: Callable[[], object] | None = None,
) -> str:
    """Materialise ``definition``: refused with ``error`` and ``fragments``, nothing changed.

    ``snapshot`` reads the database (every table's fingerprint unless told).
    """
    snapshot = snapshot or pg.snapshot
    before = snapshot()
    text = failure(run(pg, definition))
    assert f"{error}: Refused to write asset" in text, text
    assert "Nothing was changed. Fix:" in text, text
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in:\n{text}"
    assert snapshot() == before
    return text


@pytest.mark.parametrize("what", ["schema", "column"])
def test_a_name_postgres_would_cut_short_is_refused_with_its_limit(pg: Store, what: str) -> None:
    """PostgreSQL keeps 63 bytes of a name: a longer one would land in another table."""
    definitions = {
        "schema": lambda name: asset(trips, metadata={**TRIPS, "schema": name}),
        "column": lambda name: asset(lambda: trips(**{name: pa.array([1.0, 2.0])})),
    }
    fixes = {
        "schema": f"metadata={{'schema': '{SHORT}'}}",
        "column": f"df = df.rename(columns={{'{LONG}': '{SHORT}'}})",
    }
    refused(
        pg,
        definitions[what](LONG),
        "InvalidIdentifierError",
        f"{what} '{LONG}' is 64 bytes long in UTF-8; Postgres keeps at most 63 bytes",
        fixes[what],
    )
    assert run(pg, definitions[what](SHORT)).success


def test_a_table_name_postgres_would_cut_short_is_refused_with_its_limit(pg: Store) -> None:
    """Dagster names are ASCII, but a caller of ia.publish may name any table."""
    before = pg.snapshot()
    with pg.open() as backend, pytest.raises(ia.InvalidIdentifierError) as raised:
        ia.publish(backend, trips(), settings(table=LONG), window(DAY), now=NOW)
    assert f"table '{LONG}' is 64 bytes long in UTF-8; Postgres keeps at most 63" in str(
        raised.value
    )
    assert f"an asset key whose last part is at most 63 bytes, e.g. '{SHORT}'" in str(raised.value)
    assert pg.snapshot() == before
    with pg.open() as backend:
        ia.publish(backend, trips(), settings(table=SHORT), window(DAY), now=NOW)
    assert len(pg.rows(SHORT)) == 2


def test_text_holding_a_nul_character_is_refused_with_the_rows(pg: Store) -> None:
    """PostgreSQL text cannot hold U+0000; the COPY would fail with a raw encoding error."""
    bad = asset(lambda: trips(zone=pa.array(["JFK\x00Airport", "Midtown"])))
    refused(
        pg,
        bad,
        "SchemaMismatchError",
        "1 value(s) of 'zone' hold the character U+0000 (NUL), which Postgres text cannot store",
        "df['zone'] = df['zone'].str.replace('\\x00', '', regex=False)",
        "trip_id=1",
    )

    def fixed() -> pa.Table:
        batch = trips(zone=pa.array(["JFK\x00Airport", "Midtown"]))
        return batch.set_column(2, "zone", pc.replace_substring(batch["zone"], "\x00", ""))

    assert run(pg, asset(fixed)).success
    assert sorted(r[2] for r in pg.rows("trips")) == ["JFKAirport", "Midtown"]


def test_text_longer_than_a_varchar_column_holds_is_refused_with_the_widening(pg: Store) -> None:
    with pg.open() as backend:
        backend.cur.execute("CREATE SCHEMA main")
        backend.cur.execute(
            "CREATE TABLE main.trips (trip_id bigint, pickup_at timestamp, zone varchar(3))"
        )
        backend.conn.commit()
    bad = asset(lambda: trips(zone=pa.array(["JFK", "Midtown"])))
    text = refused(
        pg,
        bad,
        "SchemaMismatchError",
        "1 value(s) of 'zone' are longer than the 3 characters main.trips.zone"
        " (character varying(3)) holds, e.g. ['Midtown']",
        "ALTER TABLE main.trips ALTER COLUMN zone TYPE character varying(7)",
    )
    run_as_printed(pg, printed_migration(text))
    assert run(pg, bad).success
    assert sorted(r[2] for r in pg.rows("trips")) == ["JFK", "Midtown"]


def test_a_decimal256_column_is_refused_with_the_cast_that_fits(pg: Store) -> None:
    """The guards read the batch in DuckDB, which has no decimal256."""
    values = pa.array([1, 2], pa.decimal256(40, 2))
    refused(
        pg,
        asset(lambda: trips(price=values)),
        "SchemaMismatchError",
        "column 'price' is decimal256(40, 2)",
        "batch = batch.set_column(batch.schema.get_field_index('price'), 'price',"
        " batch['price'].cast(pa.decimal128(38, 2)))",
    )

    def fixed() -> pa.Table:
        batch = trips(price=values)
        return batch.set_column(
            batch.schema.get_field_index("price"),
            "price",
            batch["price"].cast(pa.decimal128(38, 2)),
        )

    assert run(pg, asset(fixed)).success


@pytest.mark.parametrize("zone", ["UTC", "America/New_York"])
@pytest.mark.parametrize("table_aware", [False, True], ids=["naive-table", "aware-table"])
def test_the_printed_time_zone_migration_keeps_every_instant_in_any_session(
    pg: Store, table_aware: bool, zone: str
) -> None:
    """A bare TYPE change reads naive values in the session's zone and would move them.

    A naive value is wall-clock time in the partitions' zone; run in a Tokyo session, the
    printed conversion still reads it there, so 23:30 stays in its own day.
    """
    daily = dg.DailyPartitionsDefinition(start_date="2026-01-01", timezone=zone)

    def trip(trip_id: int, day: str, aware: bool) -> dg.AssetsDefinition:
        wall = datetime.fromisoformat(day).replace(hour=23, minute=30)
        if aware:
            # Arrow reads a naive datetime as UTC: make it the instant of that wall time.
            wall = wall.replace(tzinfo=ZoneInfo(zone))
        pickup = pa.array([wall], pa.timestamp("us", tz=zone if aware else None))
        table = pa.table({"trip_id": pa.array([trip_id], pa.int64()), "pickup_at": pickup})
        return asset(lambda: table, partitions_def=daily)

    first = "2026-01-01"
    assert run(pg, trip(1, first, table_aware), first).success
    batch = trip(2, DAY, not table_aware)
    kind = "timestamp" if table_aware else "timestamp with time zone"
    text = refused(
        pg,
        batch,
        "SchemaMismatchError",
        f"ALTER TABLE main.trips ALTER COLUMN pickup_at TYPE {kind}"
        f" USING pickup_at AT TIME ZONE '{zone}'",
        f"df['pickup_at'] = df['pickup_at'].dt.tz_convert('{zone}').dt.tz_localize(None)",
    )
    run_as_printed(pg, printed_migration(text))
    assert run(pg, batch).success
    # Both trips at 23:30 of their own day: the migration moved no value, the rerun no row.
    wall = "pickup_at" if table_aware else f"pickup_at AT TIME ZONE '{zone}'"
    with pg.open() as backend:
        backend.cur.execute(
            f"SELECT trip_id, to_char({wall}, 'YYYY-MM-DD HH24:MI') FROM main.trips ORDER BY 1"
        )
        assert backend.cur.fetchall() == [(1, f"{first} 23:30"), (2, f"{DAY} 23:30")]


@pytest.mark.parametrize("sent", ["decimal", "double"])
def test_a_numeric_column_without_precision_is_given_one_that_keeps_its_values(
    pg: Store, sent: str
) -> None:
    """The printed type holds every stored value and the batch's: the rerun then succeeds."""
    with pg.open() as backend:
        backend.cur.execute("CREATE SCHEMA main")
        backend.cur.execute(
            "CREATE TABLE main.trips (trip_id bigint, pickup_at timestamp, fare numeric)"
        )
        backend.cur.execute("INSERT INTO main.trips VALUES (1, '2026-01-01 10:00', 123.4567)")
        backend.conn.commit()
    fares = {
        "decimal": pa.array([12345678, 2], pa.decimal128(10, 2)),
        "double": pa.array([1.25, 2.5]),
    }
    bad = asset(lambda: trips(fare=fares[sent]))
    kind = "numeric(12,4)" if sent == "decimal" else "double precision"
    text = refused(
        pg,
        bad,
        "SchemaMismatchError",
        "has column(s) fare (numeric) of a type Postgres does not exchange as Arrow",
        f"ALTER TABLE main.trips ALTER COLUMN fare TYPE {kind}",
        # Nothing fingerprints a column it cannot read: compare its rows as the server has them.
        snapshot=lambda: pg.rows("trips"),
    )
    run_as_printed(pg, printed_migration(text))
    assert run(pg, bad).success
    with pg.open() as backend:
        backend.cur.execute("SELECT fare::text FROM main.trips ORDER BY trip_id")
        stored = [r[0] for r in backend.cur.fetchall()]
    assert stored[0] == "123.4567"


@pytest.mark.parametrize(
    ("column_type", "digits", "unit", "floor"),
    [
        ("timestamp(0)", 0, "second", "s"),
        ("timestamptz(0)", 0, "second", "s"),
        ("timestamp(1)", 1, "tenth of a second", "100ms"),
        ("timestamp(3)", 3, "millisecond", "ms"),
        ("timestamptz(5)", 5, "10 microseconds", "10us"),
    ],
)
def test_a_value_the_stored_precision_rounds_into_the_next_day_is_refused(
    pg: Store, column_type: str, digits: int, unit: str, floor: str
) -> None:
    """A user's timestamp(0) rounds 23:59:59.6 up to midnight: the next day's row, every rerun."""
    aware = "tz" in column_type
    with pg.open() as backend:
        backend.cur.execute("CREATE SCHEMA main")
        backend.cur.execute(f"CREATE TABLE main.trips (trip_id bigint, pickup_at {column_type})")
        backend.conn.commit()
    # Four tenths of the stored unit before midnight: rounded, it is midnight.
    last = pd.Timestamp("2026-01-03") - pd.Timedelta(microseconds=4 * 10 ** (5 - digits))
    frame = pd.DataFrame({"trip_id": [1, 2], "pickup_at": [pd.Timestamp("2026-01-02 08:00"), last]})
    if aware:
        frame["pickup_at"] = frame["pickup_at"].dt.tz_localize("UTC")
    current = {"frame": frame}

    @dg.asset(name="trips", partitions_def=DAILY, metadata=TRIPS)
    def trips_frame() -> pd.DataFrame:
        return current["frame"]

    refused(
        pg,
        trips_frame,
        "StrayRowsError",
        "1 of 2 rows have 'pickup_at' inside the window at the batch's precision",
        f"rounds to the nearest {unit}",
        f"df['pickup_at'] = df['pickup_at'].dt.floor('{floor}')",
    )
    df = frame.copy()
    df["pickup_at"] = df["pickup_at"].dt.floor(floor)
    current["frame"] = df
    for _ in range(3):
        assert run(pg, trips_frame).success
    with pg.open() as backend:
        backend.cur.execute(
            "SELECT count(*) FILTER (WHERE pickup_at < '2026-01-03'), count(*) FROM main.trips"
        )
        assert backend.cur.fetchall() == [(2, 2)]


def test_a_role_owning_only_its_schema_writes_merges_and_reruns(
    postgres_server: PostgresServer,
    postgres_location: PostgresLocation,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The grants docs/postgres.md prints, run as printed: a schema of its own and nothing else.

    The owners record lives in the asset's schema, and a schema that exists is not created
    again (CREATE SCHEMA IF NOT EXISTS needs CREATE on the database even then).
    """
    database = postgres_location.database
    for statement in role_grants():
        postgres_server.psql(statement, database)
    monkeypatch.setenv("IDEM_WRITER_PASSWORD", "change-me")
    config = {
        "host": postgres_location.host,
        "port": postgres_location.port,
        "user": "warehouse_writer",
        "database": database,
        "password_env": "IDEM_WRITER_PASSWORD",
    }
    resources = {
        "io_manager": ia.PostgresOverwriteIOManager(**config),
        "merge_io_manager": ia.PostgresMergeIOManager(**config),
    }
    for name, manager in [("replaced", "io_manager"), ("merged", "merge_io_manager")]:
        definition = dg.asset(
            name=name,
            partitions_def=DAILY,
            metadata={**TRIPS, "schema": "sales"},
            io_manager_key=manager,
        )(lambda: trips())
        for _ in range(2):
            result = dg.materialize(
                [definition], resources=resources, partition_key=DAY, raise_on_error=False
            )
            assert result.success, failure(result)
    owners = postgres_server.psql('SELECT * FROM sales."idem-table-owners" ORDER BY 2', database)
    assert owners.split() == ["sales|merged|merged", "sales|replaced|replaced"]
    assert postgres_server.psql("SELECT count(*) FROM sales.replaced", database).strip() == "2"


def role_grants() -> list[str]:
    """The statements under docs/postgres.md's "A role that owns only its schema", as printed."""
    text = (DOCS.parent / "postgres.md").read_text()
    block = text.split("\n**A role that owns only its schema**", 1)[1]
    block = block.split("```sql\n", 1)[1].split("```", 1)[0]
    return [line.rstrip(";") for line in block.splitlines() if line.strip()]


def test_an_owners_record_kept_in_public_is_still_honoured(pg: Store) -> None:
    """Records from before each schema kept its own: another asset's table stays refused."""
    with pg.open() as backend:
        backend.cur.execute(
            'CREATE TABLE public."idem-table-owners" (schema_key text, table_key text,'
            " asset_key text NOT NULL, PRIMARY KEY (schema_key, table_key))"
        )
        backend.cur.execute(
            """INSERT INTO public."idem-table-owners" VALUES ('main', 'trips', 'old_trips')"""
        )
        backend.conn.commit()
    text = refused(
        pg,
        asset(trips),
        "ConfigurationError",
        "table main.trips belongs to asset 'old_trips', which wrote it first",
        """UPDATE "public"."idem-table-owners" SET asset_key = 'trips'""",
    )
    run_as_printed(pg, text.split("hand the table over first: ", 1)[1].split(".\n", 1)[0])
    assert run(pg, asset(trips)).success
