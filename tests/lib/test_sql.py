"""The SQL builders: exact text, quoted identifiers, and values bound as parameters."""

from datetime import date, datetime

import duckdb
import pytest

import idem_assets as ia
from idem_assets.lib.backends.duckdb import sql
from idem_assets.lib.model.identifiers import qualified, quote, validate_identifier
from idem_assets.lib.model.windows import Condition, Region
from idem_assets.lib.sql import statements as batch_sql


def spans(column: str, *spans: tuple[object, object]) -> Region:
    """A time window of ``spans`` on ``column``."""
    return ((Condition(column, spans=tuple(spans)),),)


def cells(column: str, parts: list[tuple[str, object, object]]) -> list:
    """Each ``(key, start, end)`` as a partition of one time column."""
    return [(key, (Condition(column, spans=((lo, hi),)),)) for key, lo, hi in parts]


DAY = (datetime(2026, 1, 1), datetime(2026, 1, 2))
LATER_DAY = (datetime(2026, 1, 5), datetime(2026, 1, 6))
TARGET = ("main", "trips")


def test_window_predicate_is_half_open_and_bound() -> None:
    assert batch_sql.window_predicate("pickup_at", [DAY]) == (
        '("pickup_at" >= $1 AND "pickup_at" < $2)',
        [datetime(2026, 1, 1), datetime(2026, 1, 2)],
    )


def test_window_predicate_covers_every_span_with_an_alias() -> None:
    text, params = batch_sql.window_predicate("pickup_at", [DAY, LATER_DAY], alias="t")
    assert text == (
        '(("t"."pickup_at" >= $1 AND "t"."pickup_at" < $2)'
        ' OR ("t"."pickup_at" >= $3 AND "t"."pickup_at" < $4))'
    )
    assert params == [*DAY, *LATER_DAY]


def test_delete_window_text_in_every_dialect() -> None:
    region = spans("pickup_at", DAY)
    assert batch_sql.delete_window(TARGET, region) == (
        'DELETE FROM "main"."trips" WHERE ("pickup_at" >= $1 AND "pickup_at" < $2)',
        list(DAY),
    )
    assert batch_sql.delete_window(TARGET, region, dialect="postgres").sql == (
        'DELETE FROM "main"."trips" WHERE ("pickup_at" >= $1 AND "pickup_at" < $2)'
    )
    # Spark binds by name: spark.sql(text, args={"p1": ..., "p2": ...}).
    spark = batch_sql.delete_window(TARGET, region, dialect="spark")
    assert (
        spark.sql == "DELETE FROM `main`.`trips` WHERE (`pickup_at` >= :p1 AND `pickup_at` < :p2)"
    )
    assert batch_sql.bind(spark.params, "spark") == {"p1": DAY[0], "p2": DAY[1]}


def test_a_question_mark_inside_a_value_is_never_taken_for_a_placeholder() -> None:
    region = ((Condition("zone", values=("a?b", "$1")),),)
    text, params = batch_sql.count_window(TARGET, region, dialect="postgres")
    assert text == 'SELECT COUNT(*) FROM "main"."trips" WHERE "zone" IN ($1, $2)'
    assert params == ["a?b", "$1"]


def test_insert_by_name_text() -> None:
    assert sql.insert_by_name('"main"."trips"', "staged") == (
        'INSERT INTO "main"."trips" BY NAME SELECT * FROM staged'
    )
    assert sql.insert_by_name('"main"."trips"', "staged", ["pickup_at"]) == (
        'INSERT INTO "main"."trips" BY NAME SELECT * FROM staged ORDER BY "pickup_at"'
    )


def test_dedupe_breaks_ties_on_every_other_column_in_name_order() -> None:
    ranked = (
        'SELECT "id", "salary", "updated_at", "name" FROM (SELECT "id", "salary", "updated_at",'
        ' "name", ROW_NUMBER() OVER (PARTITION BY "id" ORDER BY "updated_at" DESC{}, "name"'
        ' ASC{}, "salary" ASC{}) AS "idem-rank" FROM "staged") AS ranked WHERE "idem-rank" = 1'
    )
    names = ["id", "salary", "updated_at", "name"]
    # NULLs sort last in every dialect: spelt out where the dialect's default differs.
    assert batch_sql.dedupe("staged", ["id"], ["updated_at"], names) == (
        ranked.format("", "", ""),
        [],
    )
    assert batch_sql.dedupe("staged", ["id"], ["updated_at"], names, dialect="postgres").sql == (
        ranked.format(" NULLS LAST", "", "")
    )


def test_fingerprint_text_sorts_columns() -> None:
    assert batch_sql.fingerprint(TARGET, ["fare", "trip_id"]) == (
        'SELECT COUNT(*), COALESCE(SUM(CAST(HASH("fare", "trip_id") AS INT128)), 0)'
        ' FROM "main"."trips"',
        [],
    )
    assert batch_sql.fingerprint(TARGET, ["trip_id", "fare"], spans("pickup_at", DAY))[1] == list(
        DAY
    )


def test_merge_counts_binds_the_window_once_per_use() -> None:
    text, params = batch_sql.merge_counts(TARGET, "staged", ["id"], spans("pickup_at", DAY))
    assert text.count("$") == len(params) == 4
    # A semi-join, so duplicate keys in the batch cannot multiply the matches.
    assert text.endswith('FROM "main"."trips" AS t WHERE "t"."id" IN (SELECT "id" FROM "staged")')


def test_values_are_bound_never_formatted() -> None:
    hostile = "2026-01-01'); DROP TABLE trips; --"
    window = spans("pickup_at", (hostile, hostile))
    for dialect in ("duckdb", "postgres", "spark"):
        for text, params in [
            batch_sql.window_predicate("pickup_at", [(hostile, hostile)], dialect=dialect),
            batch_sql.delete_window(TARGET, window, dialect=dialect),
            batch_sql.count_window(TARGET, window, dialect=dialect),
            batch_sql.batch_profile("staged", ["pickup_at"], window, ["id"], dialect=dialect),
            batch_sql.stray_rows_sample("staged", ["pickup_at"], window, dialect=dialect),
        ]:
            assert "DROP" not in text and "2026" not in text
            assert params.count(hostile) == 2


@pytest.mark.parametrize(
    "builder",
    [
        lambda bad: batch_sql.window_predicate(bad, [DAY]),
        lambda bad: batch_sql.delete_window(TARGET, spans(bad, DAY)),
        lambda bad: sql.insert_by_name('"main"."trips"', "staged", [bad]),
        lambda bad: batch_sql.dedupe("staged", [bad], ["updated_at"], ["id"]),
        lambda bad: batch_sql.dedupe("staged", ["id"], [bad], ["id"]),
        lambda bad: batch_sql.fingerprint(TARGET, [bad]),
        lambda bad: batch_sql.delete_matching_keys(TARGET, "staged", [bad]),
        lambda bad: batch_sql.batch_profile("staged", [], (), [bad]),
        lambda bad: qualified(bad, "trips"),
    ],
)
def test_builders_refuse_identifiers_that_are_not_plain(builder: object) -> None:
    with pytest.raises(ia.InvalidIdentifierError):
        builder('pickup_at" > 0; DROP TABLE trips; --')  # type: ignore[operator]


@pytest.mark.parametrize("name", ["", "1st", "a b", "a-b", "a\n", "a\u200b", "x" * 64, None, 3])
def test_validate_identifier_refuses(name: object) -> None:
    with pytest.raises(ia.InvalidIdentifierError, match="not a plain identifier"):
        validate_identifier(name, "column")


def test_reserved_words_are_quoted_not_refused() -> None:
    assert quote(validate_identifier("order", "column")) == '"order"'
    assert qualified("main", "date") == '"main"."date"'


def test_the_builders_run_on_duckdb() -> None:
    with duckdb.connect() as conn:
        conn.execute('CREATE TABLE main.trips (id INTEGER, pickup_at DATE, "order" INTEGER)')
        conn.execute(
            "INSERT INTO main.trips VALUES (1, '2026-01-01', 1), (2, '2026-01-02', 2),"
            " (3, '2025-12-31', 3)"
        )
        span = [(date(2026, 1, 1), date(2026, 1, 2))]
        window = spans("pickup_at", *span)
        assert conn.execute(*batch_sql.count_window(TARGET, window)).fetchall() == [(1,)]
        conn.execute(*batch_sql.delete_window(TARGET, window))
        assert conn.execute("SELECT id FROM main.trips ORDER BY id").fetchall() == [(2,), (3,)]
        text, params = batch_sql.fingerprint(TARGET, ["id", "pickup_at", "order"])
        assert conn.execute(text, params).fetchall()[0][0] == 2


PARTS = [("2026-01-01", *DAY), ("2026-01-05", *LATER_DAY)]


@pytest.fixture
def moments() -> duckdb.DuckDBPyConnection:
    conn = duckdb.connect()
    conn.execute(
        "CREATE TABLE t AS SELECT * FROM (VALUES (1, TIMESTAMP '2026-01-01 10:00'),"
        " (2, TIMESTAMP '2026-01-01 11:00'), (3, TIMESTAMP '2026-01-05 00:00'),"
        " (4, TIMESTAMP '2026-01-03 00:00')) v(id, ts)"
    )
    return conn


def test_count_by_partition_leaves_out_rows_of_no_partition(
    moments: duckdb.DuckDBPyConnection,
) -> None:
    q, p = batch_sql.count_by_partition("t", cells("ts", PARTS))
    assert sorted(moments.execute(q, p).fetchall()) == [("2026-01-01", 2), ("2026-01-05", 1)]


def test_matched_by_partition_puts_keys_outside_every_partition_under_null(
    moments: duckdb.DuckDBPyConnection,
) -> None:
    moments.execute("CREATE TABLE batch AS SELECT * FROM (VALUES (1), (3), (4)) v(id)")
    q, p = batch_sql.matched_by_partition("t", "batch", ["id"], cells("ts", PARTS))
    assert sorted(moments.execute(q, p).fetchall(), key=str) == [
        ("2026-01-01", 1),
        ("2026-01-05", 1),
        (None, 1),
    ]


def test_rounded_out_of_window_shows_both_values_as_text() -> None:
    conn = duckdb.connect()
    conn.execute(
        "CREATE TABLE b AS SELECT TIMESTAMP_NS '2026-01-01 23:59:59.999999999' AS ts"
        " UNION ALL SELECT TIMESTAMP_NS '2026-01-01 12:00:00'"
    )
    day_ns = (1_767_225_600 * 10**9, 1_767_312_000 * 10**9)
    q, p = batch_sql.rounded_out_of_window("b", "ts", 6, [day_ns], aware=False)
    assert conn.execute(q, p).fetchall() == [
        ("2026-01-01 23:59:59.999999999", "2026-01-02 00:00:00", 1)
    ]


@pytest.mark.parametrize(
    ("value", "digits", "stored"),
    [
        ("2026-01-01 23:59:59.5", 0, "2026-01-02 00:00:00"),
        ("2026-01-01 23:59:59.95", 1, "2026-01-02 00:00:00"),
        ("2026-01-01 23:59:59.9996", 3, "2026-01-02 00:00:00"),
        ("2026-01-01 23:59:59.49", 0, None),
    ],
)
def test_rounded_out_of_window_rounds_half_away_from_zero(
    value: str, digits: int, stored: str | None
) -> None:
    conn = duckdb.connect()
    conn.execute(f"CREATE TABLE b AS SELECT TIMESTAMP '{value}' AS ts")
    day_ns = (1_767_225_600 * 10**9, 1_767_312_000 * 10**9)
    q, p = batch_sql.rounded_out_of_window("b", "ts", digits, [day_ns], aware=False)
    assert [r[1] for r in conn.execute(q, p).fetchall()] == ([stored] if stored else [])
