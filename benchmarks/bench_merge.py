"""3. Merge of a batch into a large table vs the fastest raw DuckDB SQL with the same result."""

import statistics
from collections.abc import Callable
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import idem_assets as ia
from benchmarks import data
from benchmarks.harness import Case, Line, Samples, Scale, interleave, line_from_times

#: (partitions in the table, rows per partition, rounds) per scale; the batch is one partition.
SIZES: dict[Scale, tuple[int, int, int]] = {
    "tiny": (10, 2_000, 2),
    "full": (30, 100_000, 11),
}
DEDUPE = f"QUALIFY row_number() OVER (PARTITION BY {data.KEY} ORDER BY updated_at DESC) = 1"


def window_sql(alias: str = "") -> str:
    """The half-open day predicate, bound as two parameters."""
    col = f"{alias}.{data.PARTITION_COLUMN}" if alias else data.PARTITION_COLUMN
    return f"{col} >= ? AND {col} < ?"


def merge_batch(day: int, current: pa.Table) -> tuple[pa.Table, dict[str, int]]:
    """Updates for 95% of ``current``'s keys, 5% new keys, 1% losing duplicates, shuffled.

    The 5% of ``current`` that the batch does not mention are stale and must be deleted.
    """
    rows = current.num_rows
    n_upd, n_dup = rows * 95 // 100, max(rows // 100, 1)
    n_new = rows - n_upd
    one_day = pa.scalar(np.timedelta64(1, "D").astype("timedelta64[us]"))
    updated = current.slice(0, n_upd)
    updated = updated.set_column(
        updated.schema.get_field_index("fare"), "fare", pc.add(updated["fare"], 1.0)
    )
    updated = updated.set_column(
        updated.schema.get_field_index("updated_at"),
        "updated_at",
        pc.add(updated["updated_at"], one_day),
    )
    # Older versions of some updated keys: dedupe_order_by=['updated_at'] must drop them.
    losers = current.slice(0, n_dup)
    losers = losers.set_column(
        losers.schema.get_field_index("fare"), "fare", pc.add(losers["fare"], 2.0)
    )
    new = data.trips(day, n_new, first_id=rows, seed=2)
    batch = pa.concat_tables([updated, losers, new])
    order = np.random.default_rng(day).permutation(batch.num_rows)
    counts = {"updates": n_upd, "new": n_new, "duplicates": n_dup, "stale": rows - n_upd}
    return batch.take(pa.array(order)).combine_chunks(), counts


def raw_delete_insert(conn: duckdb.DuckDBPyConnection, batch: pa.Table, bounds: list) -> None:
    """Delete the window, insert the batch deduplicated with QUALIFY, in one transaction."""
    conn.register("raw_batch", batch)
    try:
        conn.execute("BEGIN")
        conn.execute(f"DELETE FROM {data.TABLE} WHERE {window_sql()}", bounds)
        conn.execute(f"INSERT INTO {data.TABLE} SELECT * FROM raw_batch {DEDUPE}")
        conn.execute("COMMIT")
    finally:
        conn.unregister("raw_batch")


def raw_merge_into(conn: duckdb.DuckDBPyConnection, batch: pa.Table, bounds: list) -> None:
    """One MERGE INTO that upserts and deletes the window's rows the batch does not hold."""
    conn.register("raw_batch", batch)
    try:
        conn.execute(
            f"MERGE INTO {data.TABLE} t USING (SELECT * FROM raw_batch {DEDUPE}) s"
            f" ON t.{data.KEY} = s.{data.KEY}"
            " WHEN MATCHED THEN UPDATE SET *"
            " WHEN NOT MATCHED THEN INSERT *"
            f" WHEN NOT MATCHED BY SOURCE AND {window_sql('t')}"
            " THEN DELETE",
            bounds,
        )
    finally:
        conn.unregister("raw_batch")


def _restore(
    conn: duckdb.DuckDBPyConnection, current: pa.Table, bounds: list
) -> Callable[[], None]:
    def restore() -> None:
        conn.register("restore_batch", current)
        conn.execute("BEGIN")
        conn.execute(f"DELETE FROM {data.TABLE} WHERE {window_sql()}", bounds)
        conn.execute(f"INSERT INTO {data.TABLE} SELECT * FROM restore_batch")
        conn.execute("COMMIT")
        conn.unregister("restore_batch")

    return restore


def run(scale: Scale, repeat: int | None, workdir: Path) -> list[Line]:
    """Merge the same batch three ways on three copies of the table, restoring before each."""
    partitions, rows, rounds = SIZES[scale]
    day = partitions // 2
    days = [data.trips(d, rows, seed=1) for d in range(partitions)]
    current = days[day]
    batch, counts = merge_batch(day, current)
    start, end = data.day_bounds(day)
    bounds = [start, end]
    settings = data.settings("merge", dedupe_order_by=["updated_at"])
    window = data.window([day])
    names = ["publish (merge)", "raw DELETE+INSERT QUALIFY", "raw MERGE INTO"]
    conns = {n: duckdb.connect(str(workdir / f"merge_{i}.duckdb")) for i, n in enumerate(names)}
    try:
        for conn in conns.values():
            data.load(conn, days)
        ours = conns[names[0]]
        results: list[ia.PublishResult] = []
        runs = {
            names[0]: lambda: results.append(
                ia.publish(ours, batch, settings, window, now=data.NOW)
            ),
            names[1]: lambda: raw_delete_insert(conns[names[1]], batch, bounds),
            names[2]: lambda: raw_merge_into(conns[names[2]], batch, bounds),
        }
        # Verify before timing: all three leave exactly the same table.
        fingerprints = {}
        for name, fn in runs.items():
            fn()
            fingerprints[name] = ia.table_fingerprint(conns[name], "main", data.TABLE)
        first = results[0]
        expected = (counts["updates"], counts["new"], counts["stale"])
        equal = len(set(fingerprints.values())) == 1 and (
            (first.updated, first.inserted, first.deleted) == expected
        )
        cases = [Case(n, runs[n], prepare=_restore(conns[n], current, bounds)) for n in names]
        times = interleave(cases, repeat or rounds)
    finally:
        for conn in conns.values():
            conn.close()
    return merge_lines(
        "3 merge",
        batch,
        counts,
        partitions * rows,
        times,
        names,
        equal,
        lambda raw, ln: (
            f"ours {batch.num_rows / ln.a_median:,.0f} rows/s,"
            f" {raw} {batch.num_rows / ln.b_median:,.0f} rows/s"
        ),
    )


def merge_lines(
    bench: str,
    batch: pa.Table,
    counts: dict[str, int],
    table_rows: int,
    times: dict[str, Samples],
    names: list[str],
    equal: bool,
    sides: Callable[[str, Line], str],
) -> list[Line]:
    """Our merge (``names[0]``) against each raw merge; the target holds for the fastest one."""
    fastest = min(names[1:], key=lambda n: statistics.median(times[n].wall))
    lines = []
    for raw in names[1:]:
        ln = line_from_times(
            bench,
            f"{batch.num_rows:,} into {table_rows / 1e6:g}M",
            times,
            names[0],
            raw,
            target=("<=", 1.3) if raw == fastest else None,
            equal=equal,
        )
        ln.notes.append(
            f"batch {batch.num_rows:,} rows ({counts['updates']:,} updates, {counts['new']:,} new,"
            f" {counts['duplicates']:,} losing duplicates; {counts['stale']:,} stale window rows"
            f" deleted) into {table_rows:,}; {sides(raw, ln)}"
            + ("; target applies to the fastest raw SQL" if raw == fastest else "")
        )
        lines.append(ln)
    return lines
