"""The Postgres IO managers as a user configures them: connection, secrets, metadata, loads."""

import urllib.parse
import uuid
from datetime import datetime, timedelta
from typing import Any

import dagster as dg
import pandas as pd
import pyarrow as pa
import pytest
from postgres_server import PostgresServer

import idem_assets as ia
from idem_assets.lib.backends.postgres.backend import (
    PostgresBackend,
    PostgresConnectionError,
    PostgresLocation,
)
from idem_assets.lib.model.windows import Condition
from idem_assets.lib.sql import statements
from tests.helpers import DAILY, NOW, TRIPS_METADATA, settings, window
from tests.reliability.support import day_batch

PASSWORD_ENV = "IDEM_PG_IO_PASSWORD"
DAY, NEXT = "2026-01-01", "2026-01-02"


def config(location: PostgresLocation, **overrides: Any) -> dict[str, Any]:
    return {
        "host": location.host,
        "port": location.port,
        "user": location.user,
        "database": location.database,
        "password_env": PASSWORD_ENV,
        **overrides,
    }


@pytest.fixture
def password(postgres_location: PostgresLocation, monkeypatch: pytest.MonkeyPatch) -> str:
    secret = str(postgres_location.password)
    monkeypatch.setenv(PASSWORD_ENV, secret)
    return secret


@dg.asset(partitions_def=DAILY, metadata=TRIPS_METADATA)
def trips(context: dg.AssetExecutionContext) -> pa.Table:
    return day_batch(context.partition_key, 500)


@dg.asset(partitions_def=DAILY, io_manager_key="memory")
def trip_count(context: dg.AssetExecutionContext, trips: pd.DataFrame) -> int:
    context.add_output_metadata(
        {"days": sorted({t.date().isoformat() for t in trips["pickup_at"]}), "rows": len(trips)}
    )
    return len(trips)


def failure(result: dg.ExecuteInProcessResult) -> str:
    failed = [e for e in result.all_events if e.is_step_failure]
    data = failed[0].step_failure_data
    assert data is not None and data.error is not None
    return data.error.to_string()


def test_a_failed_connect_names_the_server_but_never_the_password(
    postgres_location: PostgresLocation, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong = "never-shown-Secr3t-6f1d2c"
    monkeypatch.setenv(PASSWORD_ENV, wrong)
    manager = ia.PostgresOverwriteIOManager(**config(postgres_location))
    result = dg.materialize(
        [trips], resources={"io_manager": manager}, partition_key=DAY, raise_on_error=False
    )
    text = failure(result)
    assert "PostgresConnectionError" in text
    assert "password authentication failed" in text
    assert f"postgresql://{postgres_location.user}@127.0.0.1:{postgres_location.port}/" in text
    assert wrong not in text
    assert wrong not in repr(manager) and wrong not in str(manager.location())


def test_a_password_in_the_url_is_never_shown_either(postgres_location: PostgresLocation) -> None:
    wrong = "url-Secr3t-never-shown"
    url = (
        f"postgresql://{postgres_location.user}:{wrong}@127.0.0.1:{postgres_location.port}/"
        f"{postgres_location.database}"
    )
    location = PostgresLocation.from_url(url)
    with pytest.raises(PostgresConnectionError) as raised:
        with PostgresBackend.connect(location):
            pass
    assert wrong not in str(raised.value) and wrong not in repr(location)


@pytest.mark.parametrize("special", ["#", "?", "/"])
def test_a_password_holding_a_character_a_url_must_escape_is_never_shown(
    postgres_server: PostgresServer, postgres_location: PostgresLocation, special: str
) -> None:
    """Unescaped, the character ends the URL's login early; the refusal shows none of it."""
    head, tail = "Hidden7Head", "Hidden7Tail"
    secret = f"{head}{special}{tail}"
    role = f"r_{uuid.uuid4().hex[:8]}"
    postgres_server.psql(
        f"CREATE ROLE {role} LOGIN PASSWORD '{secret}' SUPERUSER", postgres_location.database
    )
    loc = postgres_location
    url = f"postgresql://{role}:{secret}@{loc.host}:{loc.port}/{loc.database}"
    manager = ia.PostgresOverwriteIOManager(url=url, password_env=None)
    result = dg.materialize(
        [trips], resources={"io_manager": manager}, partition_key=DAY, raise_on_error=False
    )
    text = failure(result)
    assert "ConfigurationError" in text and "Nothing was changed. Fix:" in text
    assert "urllib.parse.quote(password, safe='')" in text
    assert head not in text and tail not in text
    # The fix as the message prints it: the password percent-encoded.
    encoded = urllib.parse.quote(secret, safe="")
    url = f"postgresql://{role}:{encoded}@{loc.host}:{loc.port}/{loc.database}"
    manager = ia.PostgresOverwriteIOManager(url=url, password_env=None)
    assert dg.materialize([trips], resources={"io_manager": manager}, partition_key=DAY).success


def test_a_url_of_another_form_is_shown_without_its_passwords() -> None:
    manager = ia.PostgresOverwriteIOManager(
        url="mysql://me:Hidden7Login@db.example:5432/wh?password=Hidden7Query&sslmode=require",
        password_env=None,
    )
    with pytest.raises(ia.ConfigurationError) as raised:
        manager.location()
    assert "'mysql://me:***@db.example:5432/wh?password=***&sslmode=require'" in str(raised.value)
    assert "Hidden7" not in str(raised.value)


def test_url_options_reach_the_session_and_the_pinned_settings_stay(
    postgres_location: PostgresLocation, password: str
) -> None:
    """``?options=-c statement_timeout=...`` is libpq's; the session keeps its UTC time zone."""
    loc = postgres_location
    url = (
        f"postgresql://{loc.user}@{loc.host}:{loc.port}/{loc.database}"
        "?options=-c%20statement_timeout%3D4321"
    )
    manager = ia.PostgresOverwriteIOManager(url=url, password_env=PASSWORD_ENV)
    with PostgresBackend.connect(manager.location()) as backend:
        backend.cur.execute(
            "SELECT current_setting('statement_timeout'), current_setting('TimeZone')"
        )
        assert backend.cur.fetchall() == [("4321ms", "UTC")]


def test_a_percent_encoded_socket_directory_is_the_host(
    postgres_server: PostgresServer, postgres_location: PostgresLocation, password: str
) -> None:
    """libpq's URL form of a Unix socket: the directory, its slashes written %2F."""
    loc = postgres_location
    socket_dir = urllib.parse.quote(str(postgres_server.root), safe="")
    url = f"postgresql://{loc.user}@{socket_dir}:{loc.port}/{loc.database}"
    manager = ia.PostgresOverwriteIOManager(url=url, password_env=PASSWORD_ENV)
    assert manager.location().host == str(postgres_server.root)
    assert dg.materialize([trips], resources={"io_manager": manager}, partition_key=DAY).success
    with PostgresBackend.connect(manager.location()) as backend:
        # No server address: the session came over the socket.
        backend.cur.execute("SELECT inet_server_addr() IS NULL, count(*) FROM main.trips")
        assert backend.cur.fetchall() == [(True, 500)]


def test_a_missing_password_variable_names_the_variable(
    postgres_location: PostgresLocation, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    manager = ia.PostgresOverwriteIOManager(**config(postgres_location))
    with pytest.raises(ia.ConfigurationError, match=f"'{PASSWORD_ENV}', which is not set"):
        manager.location()


def test_url_config_writes_and_the_metadata_matches_duckdbs(
    postgres_location: PostgresLocation, password: str, tmp_path: Any
) -> None:
    """The same metadata keys as on DuckDB, the same counts, and no secret in any value."""
    loc = postgres_location
    url = f"postgresql://{loc.user}@{loc.host}:{loc.port}/{loc.database}"
    managers = {
        "postgres": ia.PostgresOverwriteIOManager(url=url, password_env=PASSWORD_ENV),
        "duckdb": ia.DuckDBOverwriteIOManager(database=str(tmp_path / "w.duckdb")),
    }
    metadata = {}
    for name, manager in managers.items():
        for _run in range(2):
            result = dg.materialize([trips], resources={"io_manager": manager}, partition_key=DAY)
        (event,) = result.get_asset_materialization_events()
        metadata[name] = {k: v.value for k, v in event.materialization.metadata.items()}
    pg, duck = metadata["postgres"], metadata["duckdb"]
    assert set(pg) == set(duck)
    for key in ("dagster/row_count", "rows_inserted", "rows_deleted", "window", "write_mode"):
        assert pg[key] == duck[key]
    assert pg["dagster/row_count"] == 500 and pg["rows_deleted"] == 500
    assert not any(password in str(v) for v in pg.values())


def test_load_reads_only_the_window_as_pandas(
    postgres_location: PostgresLocation, password: str
) -> None:
    resources = {
        "io_manager": ia.PostgresOverwriteIOManager(**config(postgres_location)),
        "memory": dg.InMemoryIOManager(),
    }
    for day in (DAY, NEXT):
        dg.materialize([trips], resources=resources, partition_key=day)
    result = dg.materialize(
        [trips.to_source_asset(), trip_count], resources=resources, partition_key=NEXT
    )
    (event,) = result.get_asset_materialization_events()
    assert event.materialization.metadata["days"].value == [NEXT]
    assert event.materialization.metadata["rows"].value == 500


def test_load_pushes_the_half_open_window_down() -> None:
    start, end = datetime(2026, 1, 1), datetime(2026, 1, 2)
    region = ((Condition("pickup_at", spans=((start, end),)),),)
    query, params = statements.select_window(
        ("main", "trips"), None, region, ["pickup_at"], dialect="postgres"
    )
    assert query == (
        'SELECT * FROM "main"."trips" WHERE ("pickup_at" >= $1 AND "pickup_at" < $2)'
        ' ORDER BY "pickup_at"'
    )
    assert params == [start, end]


def test_the_fingerprint_ignores_row_order_and_is_deterministic(
    postgres_location: PostgresLocation,
) -> None:
    batch = day_batch(DAY, 1000)
    shuffled = batch.take(pa.array(list(reversed(range(batch.num_rows)))))
    with PostgresBackend.connect(postgres_location) as backend:
        first = ia.publish(backend, batch, settings(table="a"), window(DAY), now=NOW)
        second = ia.publish(backend, shuffled, settings(table="b"), window(DAY), now=NOW)
        again = ia.publish(backend, batch, settings(table="a"), window(DAY), now=NOW)
        stored = ia.table_fingerprint(backend, "main", "a", "pickup_at", window(DAY))
    assert first.fingerprint == second.fingerprint == again.fingerprint == stored
    assert first.fingerprint.startswith("1000:")


def test_types_round_trip_and_a_wider_batch_type_is_cast(
    postgres_location: PostgresLocation,
) -> None:
    """Every mapped type is stored and read back as written; int32 and ns timestamps fit in."""
    start = datetime(2026, 1, 1, 1)
    batch = pa.table(
        {
            "id": pa.array([1, 2], pa.int64()),
            "at": pa.array([start, start + timedelta(hours=1)], pa.timestamp("us")),
            "aware": pa.array([start, start], pa.timestamp("us", tz="UTC")),
            "day": pa.array([start.date()] * 2, pa.date32()),
            "small": pa.array([1, None], pa.int16()),
            "ratio": pa.array([0.5, None], pa.float32()),
            "price": pa.array([1, 2], pa.decimal128(10, 2)),
            "name": pa.array(["a", None]),
            "flag": pa.array([True, None]),
            "blob": pa.array([b"x", b""]),
        }
    )
    meta = {"partition_expr": "at", "primary_key": ["id"]}
    with PostgresBackend.connect(postgres_location) as backend:
        ia.publish(backend, batch, settings("overwrite", meta, table="t"), window(DAY), now=NOW)
        loaded = backend.load(settings("overwrite", meta, table="t"), window(DAY), False, True)
        assert isinstance(loaded, pa.Table)
        assert loaded.equals(batch)
        narrower = batch.set_column(0, "id", pa.array([1, 2], pa.int32())).set_column(
            1, "at", pa.array([start, start + timedelta(hours=1)], pa.timestamp("ns"))
        )
        ia.publish(backend, narrower, settings("overwrite", meta, table="t"), window(DAY), now=NOW)
        again = backend.load(settings("overwrite", meta, table="t"), window(DAY), False, True)
    assert isinstance(again, pa.Table) and again.equals(batch)


def test_a_merge_with_dedupe_order_by_keeps_the_latest_row_of_each_key(
    postgres_location: PostgresLocation,
) -> None:
    meta = {"partition_expr": "at", "primary_key": ["id"], "dedupe_order_by": ["version"]}
    start = datetime(2026, 1, 1, 6)
    batch = pa.table(
        {
            "id": pa.array([1, 1, 2], pa.int64()),
            "at": pa.array([start] * 3, pa.timestamp("us")),
            "version": pa.array([2, 1, 1], pa.int64()),
        }
    )
    write = settings("merge", meta, table="m")
    with PostgresBackend.connect(postgres_location) as backend:
        first = ia.publish(backend, batch, write, window(DAY), now=NOW)
        again = ia.publish(backend, batch, write, window(DAY), now=NOW)
        backend.cur.execute("SELECT id, version FROM main.m ORDER BY id")
        assert backend.cur.fetchall() == [(1, 2), (2, 1)]
    assert (first.inserted, again.updated, again.inserted, again.deleted) == (2, 2, 0, 0)
    assert first.fingerprint == again.fingerprint


def test_an_aware_partition_column_in_a_zoned_partitioning(
    postgres_location: PostgresLocation,
) -> None:
    """Days of America/New_York over a timestamptz column: each day holds its own instants."""
    zoned = dg.DailyPartitionsDefinition(start_date="2026-01-01", timezone="America/New_York")
    meta = {"partition_expr": "at", "primary_key": ["id"]}
    # 04:59 UTC on Jan 2 is still Jan 1 in New York; 05:00 UTC is Jan 2.
    instants = [datetime(2026, 1, 2, 4, 59), datetime(2026, 1, 2, 5, 0)]
    batch = pa.table(
        {"id": pa.array([1], pa.int64()), "at": pa.array(instants[:1], pa.timestamp("us", "UTC"))}
    )
    write = settings("overwrite", meta, table="z")
    with PostgresBackend.connect(postgres_location) as backend:
        for _run in range(2):
            ia.publish(backend, batch, write, window(DAY, partitions=zoned), now=NOW)
        stray = batch.set_column(1, "at", pa.array(instants[1:], pa.timestamp("us", "UTC")))
        with pytest.raises(ia.StrayRowsError):
            ia.publish(backend, stray, write, window(DAY, partitions=zoned), now=NOW)
        loaded = backend.load(write, window(DAY, partitions=zoned), False, True)
    assert isinstance(loaded, pa.Table) and loaded.equals(batch)


def test_a_pandas_categorical_column_is_stored_as_text(postgres_location: PostgresLocation) -> None:
    frame = pd.DataFrame(
        {
            "id": [1, 2],
            "at": pd.to_datetime(["2026-01-01 01:00", "2026-01-01 02:00"]),
            "zone": pd.Categorical(["JFK", "Midtown"]),
        }
    )
    meta = {"partition_expr": "at", "primary_key": ["id"]}
    batch = pa.Table.from_pandas(frame, preserve_index=False)
    with PostgresBackend.connect(postgres_location) as backend:
        for _run in range(2):
            ia.publish(backend, batch, settings("overwrite", meta, table="c"), window(DAY), now=NOW)
        backend.cur.execute("SELECT id, zone FROM main.c ORDER BY id")
        assert backend.cur.fetchall() == [(1, "JFK"), (2, "Midtown")]


def test_an_opted_in_widening_alters_the_column_in_the_publish(
    postgres_location: PostgresLocation,
) -> None:
    """int4 -> int8 and numeric(10,2) -> numeric(12,2) in the publish's own transaction."""
    metadata = {**TRIPS_METADATA, "schema_evolution": "widen_types"}
    narrow = day_batch(DAY, 5)
    narrow = narrow.append_column("seats", pa.array([1, 2, 3, 4, 5], pa.int32()))
    narrow = narrow.append_column("fee", pa.array([1] * 5, pa.decimal128(10, 2)))
    wide = narrow.set_column(
        narrow.schema.get_field_index("seats"), "seats", pa.array([1, 2, 3, 4, 2**40], pa.int64())
    )
    wide = wide.set_column(
        wide.schema.get_field_index("fee"), "fee", pa.array([1] * 5, pa.decimal128(12, 2))
    )
    with PostgresBackend.connect(postgres_location) as backend:
        ia.publish(backend, narrow, settings("overwrite", metadata), window(DAY), now=NOW)
        ia.publish(backend, wide, settings("overwrite", metadata), window(DAY), now=NOW)
        backend.cur.execute(
            "SELECT column_name, data_type, numeric_precision FROM information_schema.columns"
            " WHERE table_schema = 'main' AND table_name = 'trips'"
            " AND column_name IN ('seats', 'fee') ORDER BY column_name"
        )
        assert backend.cur.fetchall() == [("fee", "numeric", 12), ("seats", "bigint", 64)]
        backend.cur.execute("SELECT max(seats) FROM main.trips")
        assert backend.cur.fetchall() == [(2**40,)]


@pytest.mark.parametrize(
    ("mode", "key", "expected"),
    [
        ("overwrite", "trip_id", {"btree (pickup_at)"}),
        ("merge", "trip_id", {"btree (pickup_at)", "brin (trip_id)"}),
        # boolean has no BRIN operator class: the table is created without the key's index.
        ("merge", "flag", {"btree (pickup_at)"}),
    ],
)
def test_a_new_table_is_indexed_on_its_window_and_a_merged_one_on_its_key_ranges(
    postgres_location: PostgresLocation, mode: str, key: str, expected: set[str]
) -> None:
    rows = day_batch(DAY, 5)
    if key == "flag":
        rows = rows.append_column("flag", pa.array([True, False, True, False, True])).drop(
            ["trip_id"]
        )
        rows = rows.filter(pa.array([True, True, False, False, False]))
    md = {"partition_expr": "pickup_at", "primary_key": [key]}
    with PostgresBackend.connect(postgres_location) as backend:
        ia.publish(backend, rows, settings(mode, md), window(DAY), now=NOW)
        backend.cur.execute("SELECT indexdef FROM pg_indexes WHERE tablename = 'trips'")
        found = {d.split(" USING ")[1].split(" WITH")[0] for (d,) in backend.cur.fetchall()}
    assert found == expected


@pytest.mark.parametrize("keys", [["B", "a"], ["a-2", "a1"]])
def test_an_upsert_of_text_keys_replaces_them_under_any_collation(
    postgres_location: PostgresLocation, keys: list[str]
) -> None:
    """DuckDB orders text by bytes, PostgreSQL by the column's collation: no range may prune."""
    staff = settings(
        "merge", {"primary_key": ["k"], "delete_missing": False}, table="staff", partitioned=False
    )
    with PostgresBackend.connect(postgres_location) as backend:
        backend.cur.execute("CREATE SCHEMA IF NOT EXISTS main")
        backend.cur.execute('CREATE TABLE main.staff (k TEXT COLLATE "en-x-icu", v BIGINT)')
        backend.conn.commit()
        for version in (1, 2):
            batch = pa.table({"k": keys, "v": pa.array([version] * 2, pa.int64())})
            ia.publish(backend, batch, staff, None, now=NOW)
        backend.cur.execute('SELECT k, v FROM main.staff ORDER BY k COLLATE "C"')
        assert backend.cur.fetchall() == [(k, 2) for k in sorted(keys)]
