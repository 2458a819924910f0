"""Every refusal of a publish, decided on the staged batch and the target's summaries.

Nothing here knows the engine: the batch is judged as Arrow (in the library's embedded DuckDB
evaluator), the target through the counts its backend reports. Each guard raises an
:class:`~idem_assets.lib.model.errors.IdempotencyError` before anything has changed.
"""

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pyarrow as pa

from idem_assets.lib.model import expressions
from idem_assets.lib.model.errors import (
    ConfigurationError,
    DuplicateKeyError,
    EmptyBatchError,
    KeyOutsideWindowError,
    NullValueError,
    StrayRowsError,
)
from idem_assets.lib.model.identifiers import quote
from idem_assets.lib.model.samples import format_sample
from idem_assets.lib.model.settings import WriteSettings
from idem_assets.lib.model.windows import Bound, spans_for
from idem_assets.lib.sql import statements as batch_sql
from idem_assets.lib.sql.predicates import Statement
from idem_assets.lib.write.seam import (
    BatchProfile,
    Capabilities,
    Counts,
    Evaluator,
    Scope,
    Snapshot,
    Summary,
    Written,
)

#: Keys that readers of a Hive-style path (``column=value``) take for NULL: the empty string,
#: which Delta Lake stores as NULL, and Hive's name for the NULL partition, which Polars, Spark,
#: Arrow and DuckDB read as NULL where deltalake reads the key from its log.
NULL_KEYS = ("", "__HIVE_DEFAULT_PARTITION__")


def sample(evaluator: Evaluator, statement: Statement) -> str:
    """The statement's rows, rendered for an error message."""
    rows = evaluator.arrow(statement)
    return format_sample(rows.column_names, list(zip(*rows.to_pydict().values(), strict=True)))


def profile(scope: Scope) -> BatchProfile:
    """Count rows, NULL or stray partition values, NULL keys and (for a merge) duplicates."""
    settings, staged = scope.settings, scope.staged
    # Duplicate keys only matter to a merge; with dedupe_order_by they are resolved in the
    # write itself, so the costly distinct count runs only where it can refuse the batch.
    count_duplicates = settings.mode == "merge" and not settings.dedupe_order_by
    statement = batch_sql.batch_profile(
        _rel(staged.relation),
        scope.pcols,
        scope.region,
        scope.key,
        count_duplicates,
        dialect=staged.evaluator.dialect,
    )
    try:
        found = staged.evaluator.rows(statement)
    except Exception as exc:
        # An expression that fails on a value (an overflow) rather than giving NULL.
        terms = [t for t in scope.pcols if expressions.is_expression(t)]
        if not terms:
            raise
        raise NullValueError(
            f"Refused to write {scope.where}: partition_expr {terms[0]} cannot be computed on"
            f" every row of the batch ({str(exc).splitlines()[0]}), so some rows belong to no"
            " partition. Nothing was changed. Fix: correct or drop those rows before returning"
            f" the batch, or {expressions.compute_instead(terms[0])}."
        ) from exc
    return BatchProfile(*(found[0] if found else (0,) * 5))


def refuse_unsupported_expressions(settings: WriteSettings, caps: Capabilities) -> None:
    """Refuse a ``partition_expr`` expression on an engine that scopes writes by a column only."""
    if caps.expression_dialect is not None:
        return
    for _, term in settings.partition_columns:
        if expressions.is_expression(term):
            expressions.refuse_unsupported(term, settings.asset, caps.engine)


def _rel(relation: str) -> str:
    """A staged relation's name as the statements take it (registered names come quoted)."""
    return relation[1:-1].replace('""', '"') if relation.startswith('"') else relation


def refuse_unsafe_rows(scope: Scope, found: BatchProfile) -> None:
    """Refuse NULL or stray partition values, NULL keys and (for a merge) duplicate keys.

    Stray rows that only the stored precision moves out of the window are explained by
    :func:`refuse_rounded_out`; call it before this one when ``outside``.
    """
    pcols, key, where = scope.pcols, scope.key, scope.where
    ev = scope.staged.evaluator
    source, dialect = _rel(scope.staged.relation), ev.dialect
    rows = found.rows
    named = ", ".join(f"'{c}'" for c in pcols)
    if found.null_partition:
        computed = [t for t in pcols if expressions.is_expression(t)]
        what = (
            f"no value for partition_expr {', '.join(computed)} (NULL, or a value it cannot"
            " convert)"
            if computed
            else f"NULL in partition column {named}"
        )
        raise NullValueError(
            f"Refused to write {where}: {found.null_partition} of {rows} rows have {what}, so"
            " they belong to no partition. Nothing was changed. Fix: drop or date those rows"
            " (give them their partition's value) before returning the batch. Sample:\n"
            + sample(ev, batch_sql.null_sample(source, list(pcols), dialect=dialect))
        )
    if found.outside and pcols and scope.window:
        stray = batch_sql.stray_rows_sample(source, pcols, scope.region, dialect=dialect)
        raise StrayRowsError(
            f"Refused to write {where}: {found.outside} of {rows} rows have {named} outside the"
            f" window {describe_region(scope)}. Writing them"
            " would put rows into another partition (or, for a partition overwrite, wipe it)."
            f" Nothing was changed. Fix: filter the batch to the run's window ({_filter(scope)}),"
            " or route those rows to their own partition's run. Sample:\n" + sample(ev, stray)
        )
    if found.null_key:
        raise NullValueError(
            f"Refused to write {where}: {found.null_key} rows have NULL in key column(s) {key},"
            " so they can never be matched by a rerun. Nothing was changed. Fix: fill or drop"
            " them. Sample:\n" + sample(ev, batch_sql.null_sample(source, key, dialect=dialect))
        )
    if found.duplicates:
        raise DuplicateKeyError(
            f"Refused to write {where}: the batch holds {found.duplicates} extra row(s) for keys"
            f" that appear more than once in {key}; a merge would keep an arbitrary one or"
            " insert both. Nothing was changed. Fix: deduplicate the batch, or name the"
            " column(s) that pick the winner (the latest wins): metadata={'primary_key': "
            f"{key!r}, 'dedupe_order_by': ['updated_at']}}. Sample:\n"
            + sample(ev, batch_sql.duplicate_key_sample(source, key, dialect=dialect))
        )


#: A number of fractional second digits: its unit's name, and its ``pandas`` floor frequency.
_ROUNDED_TO = {
    0: ("second", "s"),
    1: ("tenth of a second", "100ms"),
    2: ("hundredth of a second", "10ms"),
    3: ("millisecond", "ms"),
    4: ("100 microseconds", "100us"),
    5: ("10 microseconds", "10us"),
    6: ("microsecond", "us"),
}


def refuse_rounded_out(scope: Scope, rows: int) -> None:
    """Refuse rows inside the window as sent but outside it as stored, rounded.

    Driven by the stored precision the backend reports (:attr:`Staged.rounds`): a column that
    keeps fewer fractional digits than the batch rounds 23:59:59.7 up to the next day, where
    that day's run would delete the row and every rerun of this one add it again.
    """
    window, time_column, staged = scope.window, scope.time_column, scope.staged
    if window is None or time_column is None or not window.timed:
        return
    rounding = next((r for r in scope.fitted.rounds if r.stored_name == time_column), None)
    if rounding is None:
        return
    stored_type = scope.fitted.partition_types[time_column]
    ev = staged.evaluator
    spans = [(_epoch_ns(a), _epoch_ns(b)) for a, b in spans_for(window, stored_type)]
    aware = pa.types.is_timestamp(stored_type) and stored_type.tz is not None
    found = ev.rows(
        batch_sql.rounded_out_of_window(
            _rel(staged.sent), rounding.column, rounding.digits, spans, aware
        )
    )
    if not found:
        return
    unit, floor = _ROUNDED_TO[rounding.digits]
    c = rounding.column
    batch_type = ev.rows(f"DESCRIBE SELECT {quote(c)} FROM {staged.sent}")[0][1]
    raise StrayRowsError(
        f"Refused to write {scope.where}: {found[0][2]} of {rows} rows have '{c}' inside the"
        f" window at the batch's precision ({batch_type}) but outside it as stored: the"
        f" table's {rounding.stored_sql} rounds to the nearest {unit}, so {found[0][0]} becomes"
        f" {found[0][1]}. Stored there, a row would belong to the next partition: that"
        " partition's run would delete it, and every rerun of this one would add it again."
        " Nothing was changed. Fix: floor the column to the stored precision before returning"
        f" it, e.g. df['{c}'] = df['{c}'].dt.floor('{floor}'). Sample:\n"
        + format_sample(["batch_value", "stored_value"], [r[:2] for r in found])
    )


def _epoch_ns(bound: Bound) -> int:
    """A timestamp bound as nanoseconds since the epoch (a naive one as if UTC)."""
    assert isinstance(bound, datetime), "a timestamp column's window bounds are datetimes"
    aware = bound if bound.tzinfo is not None else bound.replace(tzinfo=UTC)
    return (aware - _EPOCH) // timedelta(microseconds=1) * 1000


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def refuse_erasing(scope: Scope, rows: int, existing: Counts) -> None:
    """Refuse a batch that would empty a partition holding rows, unless that is declared."""
    settings = scope.settings
    # An upsert without deletes cannot erase anything, so only the replacing writes are guarded.
    erases = settings.mode == "overwrite" or settings.delete_missing
    total = sum(existing.values())
    if not total or not erases or settings.allow_empty:
        return
    if scope.cells:
        batch_by_part: dict[str, int] = {}
        if rows:
            ev = scope.staged.evaluator
            counted = batch_sql.count_by_partition(
                _rel(scope.staged.relation), scope.cells, dialect=ev.dialect
            )
            batch_by_part = dict(ev.rows(counted))
        emptied = [k for k, _ in scope.cells if existing.get(k) and not batch_by_part.get(k)]
        if emptied:
            raise EmptyBatchError(
                f"Refused to write {scope.where}: the batch has no rows for partition(s)"
                f" {emptied}, which hold {[existing[k] for k in emptied]} rows; publishing it"
                " would silently erase them. Nothing was changed. Fix: find out why the input"
                " has no rows for them (or run only the partitions it covers); if they really"
                " are empty now, declare it: metadata={'allow_empty': True}."
            )
    elif rows == 0:
        raise EmptyBatchError(
            f"Refused to write {scope.where}: the batch is empty but the window holds {total}"
            " rows; publishing it would silently erase them. Nothing was changed. Fix: find"
            " out why the input is empty; if the partition really is empty now, declare it:"
            " metadata={'allow_empty': True}."
        )


def refuse_misplaced(scope: Scope, summary: Summary, written: Written, engine: str) -> None:
    """Refuse a write the engine's SQL places otherwise than the guards' evaluator did.

    An expression is judged on the staged batch in the evaluator's dialect and deletes, counts
    and loads in the engine's, and the two need not agree on every value (a lenient date
    parser). Written rows must land where the guards placed them: the window as the engine
    counts it must hold what the publish leaves there, partition by partition. Every row
    stored was so checked when written, so the engine places the stored rows as the guards did.
    """
    placed = written.placed
    if placed is None:
        return
    settings = scope.settings
    if settings.mode == "overwrite" or settings.delete_missing:
        expected = written.rows
    else:
        expected = sum(summary.existing.values()) - sum(summary.matched.values()) + written.rows
    judged = {k: n for k, (n, _) in written.fingerprints.items() if n}
    counted = {k: n for k, n in placed.items() if n}
    if sum(counted.values()) == expected and counted == judged:
        return
    terms = [t for t in scope.pcols if expressions.is_expression(t)]
    by_partition = f" (by partition {judged}, {engine}: {counted})" if scope.cells else ""
    raise StrayRowsError(
        f"Refused to write {scope.where}: {engine} places {sum(counted.values())} rows in the"
        f" window by its own evaluation of partition_expr {', '.join(terms)}, where the guards"
        f" placed {expected}{by_partition}: the expression"
        f" means something else in {engine}'s SQL than in the evaluator's for some of the"
        " batch's values, so a rerun would not replace exactly these rows. Nothing was"
        f" changed (the write was rolled back). Fix: {expressions.compute_instead(terms[0])}."
    )


def refuse_keys_elsewhere(scope: Scope, summary: Summary, concurrent: bool = False) -> None:
    """Refuse a merge whose batch holds keys that live in partitions this run does not own.

    ``concurrent``: a writer of another partition committed them while this one ran.
    """
    outside_keys = summary.elsewhere
    if not outside_keys or not scope.pcols:
        return
    shown = summary.sample
    existing_sample = (
        format_sample(shown.column_names, list(zip(*shown.to_pydict().values(), strict=True)))
        if shown is not None
        else ""
    )
    meanwhile = (
        " (a concurrent run of another partition stored them there while this one ran)"
        if concurrent
        else ""
    )
    raise KeyOutsideWindowError(
        f"Refused to write {scope.where}: {outside_keys} key(s) of the batch already exist"
        f" in other partitions{meanwhile}; merging would move those rows out of partitions"
        " this run does not own. Nothing was changed. Fix: rerun the partition that holds"
        " them first so they leave it, or correct the key. Existing rows:\n" + existing_sample
    )


def describe_region(scope: Scope) -> str:
    """The window in the partition columns' terms: ``[start, end)`` and each column's values."""
    window = scope.window
    if window is None:
        return "(none)"
    if not window.categories():
        return f"[{window.start}, {window.end})"
    parts = []
    if window.timed and scope.time_column:
        parts.append(f"'{scope.time_column}' in [{window.start}, {window.end})")
    by_dim = dict(scope.settings.partition_columns)
    for dim, values in window.categories().items():
        parts.append(f"'{by_dim[dim]}' in {values}")
    return " and ".join(parts)


def _filter(scope: Scope) -> str:
    """Where the asset finds its window: Dagster's context, per partition kind."""
    window = scope.window
    if window is None or not window.categories():
        return "context.partition_time_window"
    if window.time_dimension is None and len(window.categories()) == 1:
        return "context.partition_keys"
    return (
        "context.partition_key.keys_by_dimension, or context.partition_keys for a range,"
        " with context.partition_time_window for the time dimension"
    )


def refuse_foreign(settings: WriteSettings, where: str, snapshot: Snapshot, engine: str) -> None:
    """Refuse a table another asset owns, or one nobody owns that the write cannot claim."""
    if snapshot.owner is not None:
        refuse_other_owner(settings, where, snapshot.owner, snapshot)
    elif snapshot.exists and not snapshot.claimable:
        refuse_unclaimed(settings, where, engine, handover(snapshot, settings))


def handover(snapshot: Snapshot, settings: WriteSettings) -> str:
    """The snapshot's handover code for ``settings.asset`` (``{asset}`` in it is the asset)."""
    return snapshot.handover.replace("{asset}", settings.asset)


def refuse_other_owner(settings: WriteSettings, where: str, owner: str, snapshot: Snapshot) -> None:
    """Refuse to write a table another asset wrote first; the snapshot says how to hand it over."""
    if owner == settings.asset:
        return
    target = f"{settings.schema}.{settings.table}"
    prefix = settings.asset.split("/")[:-1]
    by_case = (
        " The two asset keys differ only in case, and DuckDB compares names without regard to case."
        if owner.lower() == settings.asset.lower()
        else ""
    )
    own_table = (
        f"metadata={{'schema': '{prefix[-1]}'}} (or leave the IO manager's 'schema' unset, so"
        " the key prefix names the schema)"
        if prefix and prefix[-1].lower() != settings.schema.lower()
        else "another asset name, or metadata={'schema': '<a schema of its own>'}"
    )
    raise ConfigurationError(
        f"Refused to write {where}: table {target} belongs to asset '{owner}', which wrote it"
        f" first; two assets writing one table would replace each other's rows.{by_case}"
        f" Nothing was changed. Fix: give this asset a table of its own: {own_table}. If this"
        f" asset replaces '{owner}' (a renamed asset), hand the table over first: "
        + handover(snapshot, settings)
        + "."
    )


def refuse_unclaimed(settings: WriteSettings, where: str, engine: str, handover: str) -> None:
    """Refuse a table no asset owns that the publish cannot claim in the commit of its rows."""
    target = f"{settings.schema}.{settings.table}"
    raise ConfigurationError(
        f"Refused to write {where}: table {target} exists, but no asset owns it: another tool"
        f" wrote it (or its owner record was lost). {engine} cannot record an owner in the"
        " commit that writes rows, and a commit of its own would claim the table even if the"
        " write then failed. Nothing was changed. Fix: if asset"
        f" '{settings.asset}' is to write this table from now on, hand it over once: {handover}"
        " (the table keeps its rows and layout); otherwise give the asset a table of its own:"
        " metadata={'schema': '<a schema of its own>'}."
    )


def refuse_removing_appended(scope: Scope, summary: Summary, engine: str) -> None:
    """Refuse a write that removes rows from a table that takes only appends."""
    snapshot, settings = scope.snapshot, scope.settings
    if not snapshot.append_only:
        return
    existing, matched, lift = summary.existing, summary.matched, snapshot.lift_append_only
    if settings.mode == "overwrite":
        what = "an overwrite replaces the window's files (even where the window holds no rows)"
    else:
        updated = sum(matched.values())
        deleted = sum(existing.values()) - updated if settings.delete_missing else 0
        if not updated and not deleted:
            return
        what = (
            f"this merge updates {updated} and deletes {deleted} stored row(s), rewriting their"
            " files"
        )
    raise ConfigurationError(
        f"Refused to write {scope.where}: table {scope.table_name} is append-only"
        f" ({snapshot.append_only_property}), and {engine} refuses every commit that removes a"
        f" file; {what}."
        " Nothing was changed. Fix: if the table may have rows replaced, lift the property"
        f" once: {lift}; otherwise write only new keys to it (the merge IO manager, a batch"
        " whose keys the table does not hold)."
    )


def refuse_unstorable_keys(scope: Scope, caps: Capabilities) -> None:
    """Refuse a category key readers take for NULL in its path, or too long for a file name."""
    if caps.key_path is None:
        return
    engine, name_limit = caps.engine, scope.snapshot.path_limit
    paths = key_paths(scope, caps.key_path)
    for (column, key), segment in paths.items():
        if key == "":
            raise ConfigurationError(
                f"Refused to write {scope.where}: its key for partition column '{column}' is"
                f" the empty string, which {engine} stores in a partition column as NULL: the"
                " rows would read back in no partition, and a rerun would keep them beside the"
                " new ones. Nothing was changed. Fix: give the partition a non-empty key (e.g."
                " 'none' in its dg.StaticPartitionsDefinition, or dynamic partition keys"
                " without ''), and its rows that value."
            )
        if key in NULL_KEYS:
            raise ConfigurationError(
                f"Refused to write {scope.where}: its key for partition column '{column}' is"
                f" {key!r}, the name Hive-style partition paths give NULL: {engine} would"
                f" store the rows under '{segment}', which deltalake reads back as the key but"
                " Polars, Spark, Arrow and DuckDB read as NULL, so for them the rows would be"
                " in no partition. Nothing was changed. Fix: give the partition another key"
                " (e.g. 'default' in its dg.StaticPartitionsDefinition, or another dynamic"
                " partition key), and its rows that value."
            )
        size = len(segment.encode())
        if name_limit is not None and size > name_limit:
            raise ConfigurationError(
                f"Refused to write {scope.where}: its key for partition column '{column}'"
                f" ({len(str(key))} characters) would name a directory of {size} bytes"
                f" ('{segment[:48]}...'), and the file system takes names of at most"
                f" {name_limit} bytes ({engine} writes a byte other than A-Z, a-z, 0-9 and"
                " -._~ as three). Nothing was changed. Fix: give the partition a key of at"
                f" most {name_limit - len(column.encode()) - 1} bytes so written (a code, or a"
                " hash of the name), and keep the long name in a column of its own."
            )


def key_paths(
    scope: Scope, key_path: Callable[[str, object], str]
) -> dict[tuple[str, object], str]:
    """The path segment each ``(column, key)`` of the window's categories is stored under.

    An existing table writes the columns of its layout into paths; a new one, every category
    column (an engine that writes keys into paths lays its tables out by them).
    """
    snapshot = scope.snapshot
    in_paths = set(snapshot.layout) if snapshot.exists else set(scope.pcols) - {scope.time_column}
    found: dict[tuple[str, object], str] = {}
    for box in scope.region:
        for cond in box:
            if cond.column not in in_paths:
                continue
            for value in cond.values:
                found[(cond.column, value)] = key_path(cond.column, value)
    return found
