"""The seam between the engine-neutral publish and an engine: data in, data out.

A backend opens one transaction per publish (:meth:`Backend.begin`); the :class:`Transaction` it
yields reads the target once (:meth:`~Transaction.describe` -> :class:`Snapshot`), stages the
batch as it will be stored (:meth:`~Transaction.stage` -> :class:`Staged`), counts what the
window holds (:meth:`~Transaction.summarize` -> :class:`Summary`) and executes the write plan it
is handed (:meth:`~Transaction.write` -> :class:`Written`). Each step takes the one before's
result, so the order is the types'. What differs between engines is declared once as
:class:`Capabilities`; every refusal is the guards' (:mod:`idem_assets.lib.write.guards`),
decided on that data, so no backend refuses anything and none imports the guards.

Adding an engine is a folder under ``idem_assets/lib/backends/`` implementing these two
protocols, its factory in ``tests/conformance/conftest.py`` and its docs page
(docs/architecture.md says how).
"""

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, runtime_checkable

import pyarrow as pa

from idem_assets.lib.model import expressions
from idem_assets.lib.model.settings import WriteSettings
from idem_assets.lib.model.windows import Cell, Region, WriteWindow
from idem_assets.lib.sql.predicates import Statement
from idem_assets.lib.write.schema_fit import ColumnFit, SchemaChange, TypeDialect

if TYPE_CHECKING:
    # Only the annotations name pandas: importing it costs a run worker about a second.
    import pandas as pd

    from idem_assets.lib.write.streams import Spilled, Stream

#: ``(dimension, column)`` pairs, or one column name (a one-dimensional ``partition_expr``).
PartitionColumns = Sequence[tuple[str, str]] | str | None

#: Per-partition counts of a range, or the whole window's under the key ``None``.
Counts = dict[str | None, int]

#: Count and hash sum of rows, per partition of a range (the whole window under ``None``).
Fingerprints = dict[str | None, tuple[int, int]]


@dataclass(frozen=True)
class TableRef:
    """A table by schema and name, as the asset's settings resolve them."""

    schema: str
    table: str

    @property
    def name(self) -> str:
        """``schema.table`` for messages."""
        return f"{self.schema}.{self.table}"

    @classmethod
    def of(cls, settings: WriteSettings) -> "TableRef":
        """The table an asset's settings name."""
        return cls(settings.schema, settings.table)


@dataclass(frozen=True)
class StoredColumn:
    """One column of a stored table, as the engine reports it."""

    #: Its values as Arrow; ``None`` for a type the engine cannot read or write as Arrow.
    type: pa.DataType | None
    #: The engine's own spelling of its type, for messages and migrations.
    sql: str
    #: The fractional second digits a timestamp column keeps, when fewer than its Arrow unit's
    #: (PostgreSQL's ``timestamp(0)``): the engine rounds finer values to them.
    digits: int | None = None
    #: The most characters a text column holds (``varchar(n)``), ``None`` without a limit.
    length: int | None = None


@dataclass(frozen=True)
class Snapshot:
    """The target as one publish read it, before it changes anything."""

    table: TableRef
    #: The table's columns in storage order; ``None`` when there is no table yet.
    columns: Mapping[str, StoredColumn] | None
    #: The asset recorded as the table's writer, or ``None`` when none claimed it yet.
    owner: str | None = None
    #: Whether a publish can record its asset as the owner in the commit that writes its rows;
    #: a table nobody owns that cannot be claimed so must be handed over first.
    claimable: bool = True
    #: Code (or SQL) that records another asset as the table's owner, for the refusal's fix.
    handover: str = ""
    #: Whether the table refuses every commit that removes rows, and the code that lifts it.
    append_only: bool = False
    lift_append_only: str = ""
    #: The longest path segment the table's storage takes, where keys are written into paths.
    path_limit: int | None = None
    #: The columns the table's storage lays its files out by (Delta's partition columns).
    layout: tuple[str, ...] = ()
    #: For a ``numeric`` column of no precision: digits its values need (schema_fit's advice).
    numeric_digits: Mapping[str, Any] = field(default_factory=dict)
    #: The type dialect of this table, where its migrations name it (Delta Lake's URI);
    #: ``None``: the engine's own (:attr:`Capabilities.types`).
    types_dialect: TypeDialect | None = None
    #: The table property that makes it append-only, for the refusal's message.
    append_only_property: str = ""

    @property
    def exists(self) -> bool:
        """Whether there is a table yet."""
        return self.columns is not None

    def types(self) -> dict[str, pa.DataType] | None:
        """The readable columns' Arrow types (``None`` without a table)."""
        if self.columns is None:
            return None
        return {n: c.type for n, c in self.columns.items() if c.type is not None}


@dataclass(frozen=True)
class Rounding:
    """A stored timestamp column that keeps fewer fractional digits than the batch sends.

    The engine rounds a value to them, half away from zero (PostgreSQL's ``timestamp(0)``,
    DuckDB's ``TIMESTAMP_S``), which can move it past a window bound.
    """

    #: The column as the batch names it, in :attr:`Staged.sent`.
    column: str
    stored_name: str
    #: The fractional second digits the stored column keeps, 0 to 6.
    digits: int
    #: The stored column's type as the engine spells it, for messages.
    stored_sql: str


@dataclass(frozen=True)
class Fitted:
    """The batch fitted to its table (names, types, changes): what the engine stages."""

    #: The settings with every column name spelt as the table spells it.
    settings: WriteSettings
    columns: tuple[ColumnFit, ...]
    #: The schema changes the asset opted into that this batch needs; the write makes them.
    changes: tuple[SchemaChange, ...]
    #: Columns the engine stores rounded to fewer digits (the guards refuse a crossed bound).
    rounds: tuple[Rounding, ...]
    #: The stored columns in the order the table holds them once changed (added ones last).
    order: tuple[str, ...]

    @property
    def partition_types(self) -> dict[str, pa.DataType]:
        """Each partition term's type (window bounds and values depend on them).

        A stored column's own, or a ``partition_expr`` expression's result type.
        """
        types = {c.stored_name: c.stored_type for c in self.columns}
        return {
            c: expressions.result_type(c) if expressions.is_expression(c) else types[c]
            for c in self.settings.partition_names
        }


class Evaluator(Protocol):
    """Where the guards read the staged batch: SQL in one dialect, rows or Arrow out."""

    #: The sqlglot dialect its statements are rendered in.
    dialect: str

    def rows(self, statement: Statement | str) -> list[tuple[Any, ...]]:
        """Run ``statement`` and fetch every row."""
        ...

    def arrow(self, statement: Statement | str) -> pa.Table:
        """Run ``statement`` and fetch its rows as Arrow."""
        ...


@dataclass(frozen=True)
class EngineBatch:
    """A batch that stays in its engine (a Spark DataFrame), with a probe of its values in Arrow.

    The checks on values that run before staging (names, lossy casts, run-time values) read
    ``probe``: the batch's schema and a few of its rows, chosen by the engine so that each of
    those checks decides on them as on the whole batch (each column's extremes, the values
    that look like uuids). The frame itself reaches only :meth:`Transaction.stage`.
    """

    frame: Any
    probe: pa.Table
    #: Every row as Arrow, a bounded table at a time, for the checks that count values (lossy
    #: casts, text the table cannot hold); ``None``: those checks read the probe (Spark's).
    values: Callable[[], Iterator[pa.Table]] | None = None


def probe_of(batch: "pa.Table | EngineBatch") -> pa.Table:
    """What the checks before staging read: an Arrow batch itself, or an engine batch's probe."""
    return batch.probe if isinstance(batch, EngineBatch) else batch


def values_of(batch: "pa.Table | EngineBatch") -> Callable[[], Iterator[pa.Table]]:
    """Where the checks that count values read them: the batch, or an engine batch's chunks."""
    if isinstance(batch, EngineBatch):
        values, probe = batch.values, batch.probe
        return values if values is not None else lambda: iter([probe])
    return lambda: iter([batch])


@dataclass(frozen=True)
class Staged:
    """The batch as it will be stored, where the evaluator reads it."""

    #: The relation the evaluator reads the staged rows by (stored names, types, rounding).
    relation: str
    evaluator: Evaluator
    #: The batch as sent, under the name the evaluator reads it by ("" without any rounding).
    sent: str = ""


@dataclass(frozen=True)
class BatchProfile:
    """One scan of the staged batch: what every row-level guard needs."""

    rows: int
    null_partition: int
    outside: int
    null_key: int
    duplicates: int


@dataclass(frozen=True)
class Scope:
    """What one publish writes: the fitted and staged batch, the target and the window."""

    fitted: Fitted
    staged: Staged
    snapshot: Snapshot
    window: WriteWindow | None
    #: "asset 'x', partition D", for messages.
    where: str
    #: The partition columns as stored, time first; empty without a window.
    pcols: tuple[str, ...]
    #: The window as rows of those columns (empty without a window).
    region: Region
    #: A range's partitions with their boxes; empty for one partition or none.
    cells: list[Cell]

    @property
    def settings(self) -> WriteSettings:
        """The asset's settings, spelt as stored."""
        return self.fitted.settings

    @property
    def table_exists(self) -> bool:
        """Whether the table existed when the publish read it."""
        return self.snapshot.exists

    @property
    def time_column(self) -> str | None:
        """The stored time column when the window has a time dimension."""
        return self.settings.time_column if self.pcols else None

    @property
    def key(self) -> list[str]:
        """The merge key, spelt as stored."""
        return list(self.settings.primary_key)

    @property
    def table_name(self) -> str:
        """``schema.table`` for messages and metadata."""
        return self.snapshot.table.name


@dataclass(frozen=True)
class Summary:
    """What the window holds now, counted in the publish's transaction."""

    #: Rows the window holds, per partition of a range.
    existing: Counts = field(default_factory=dict)
    #: For a merge: the window's rows whose key the batch holds, per partition of a range.
    matched: Counts = field(default_factory=dict)
    #: For a merge: rows outside the window whose key the batch holds, and a few of them.
    elsewhere: int = 0
    sample: pa.Table | None = None


#: Reports a long publish's progress (the IO managers pass the run's log).
Progress = Callable[[str], None]


def no_progress(message: str) -> None:
    """The progress hook of a caller that does not listen."""


@dataclass(frozen=True)
class WritePlan:
    """What the write does, decided by the publish once every guard has passed."""

    scope: Scope
    #: Whether there is no table yet: the write creates it (partitioned as the engine lays out).
    create: bool
    #: Whether the write records the asset as the table's owner (in the same commit).
    claim: bool
    #: Where a write that reads the staged rows back into the engine says how far it got.
    progress: Progress = no_progress


@dataclass(frozen=True)
class Written:
    """What the write did, before the commit."""

    #: Rows written: the batch's, after deduplication for a merge.
    rows: int
    #: The window as the write leaves it, per partition of a range.
    fingerprints: Fingerprints
    #: The owner recorded once the write claimed the table (a concurrent claim may have won).
    owner: str | None = None
    #: The window's rows per partition of a range (the whole window's under ``None``) as the
    #: engine's own SQL places them, where it evaluates a ``partition_expr`` expression itself
    #: and the evaluator judged the batch in another dialect; ``None`` otherwise.
    placed: Counts | None = None


@dataclass(frozen=True)
class Capabilities:
    """What an engine does differently, declared once; the publish and the guards read it."""

    #: The engine's name, for messages ("DuckDB", "Postgres", "Delta Lake").
    engine: str
    #: How the engine stores types and spells them (schema_fit's decisions).
    types: TypeDialect
    #: "transaction": one transaction, rolled back on any error. "optimistic": one commit that
    #: can lose to a concurrent writer (CommitConflict), after which the publish starts over.
    commit: Literal["transaction", "optimistic"] = "transaction"
    #: How the engine stores a timestamp finer than its column keeps: "round" (its cast, to the
    #: column's digits: the guards refuse a value so moved past a window bound) or "floor" (the
    #: staged batch is floored in Arrow, which never crosses a bound).
    timestamps: Literal["round", "floor"] = "floor"
    #: Schema changes the write can make in the publish's own commit.
    schema_changes: frozenset[str] = frozenset({"add_column", "widen_type"})
    #: Of the widenings schema_fit allows, those the commit makes in place (old type, new
    #: type), and how the engine words them; ``None``: every one (Iceberg promotes only some).
    widens: Callable[[pa.DataType, pa.DataType], bool] | None = None
    widens_only: str = ""
    #: Whether text may hold NUL (PostgreSQL's text cannot).
    text_holds_nul: bool = True
    #: The longest identifier in bytes the engine keeps whole (PostgreSQL cuts at 63).
    max_name_bytes: int | None = None
    #: Where category keys become path segments (Hive-style ``column=value``), the segment a
    #: key is stored under; the guards refuse keys readers interpret and names too long.
    key_path: Callable[[str, object], str] | None = None
    #: Whether a merge's keys must be counted again under a lock right before the commit, as
    #: READ COMMITTED hides another partition's uncommitted keys (PostgreSQL).
    recheck_keys_at_commit: bool = False
    #: Whether the engine's fingerprints are the embedded evaluator's hash sums, so a plan can
    #: predict the one a publish will record; Spark hashes rows with its own function.
    plan_predicts_fingerprints: bool = True
    #: The sqlglot dialect the engine evaluates a ``partition_expr`` SQL expression in (its
    #: deletes, counts and loads); ``None``: it lays its files out by the stored partition
    #: column and scopes a write by that column only, so an expression is refused.
    expression_dialect: str | None = None
    #: Whether the staged batch's evaluator reads the target table too (DuckDB's one
    #: connection): a plan then compares the two there instead of loading the window as Arrow.
    evaluator_reads_target: bool = False
    #: Whether a streamed batch is staged in its target table itself, inside the publish's
    #: transaction (:class:`StagesInPlace`), so it is written once rather than staged and
    #: copied; the engine says when a batch cannot be (it falls back to a staged copy).
    stages_in_place: bool = False
    #: Whether a streamed batch may be staged as the table's own data files, written once,
    #: outside its log until the commit adds them (:class:`StagesFiles`); the engine says when
    #: it cannot be (the batch is then staged apart).
    stages_files: bool = False
    #: Whether the rows go into the engine in the commit (a held-back write that the commit
    #: makes: Delta Lake's and Iceberg's data files), not in the write before it.
    writes_in_commit: bool = False


@runtime_checkable
class Transaction(Protocol):
    """One publish's transaction (or held-back commit); it commits when its ``with`` ends."""

    #: What the engine adds to the publish's metadata once committed (e.g. its version).
    committed: dict[str, Any]

    def describe(self, settings: WriteSettings) -> Snapshot:
        """The target's columns, owner and state, read once; later reads use this snapshot."""
        ...

    def stage(self, batch: pa.Table | Any, fitted: Fitted) -> Staged:
        """The batch as stored (names, types, the engine's rounding), for the guards to read.

        ``batch`` is Arrow, or the frame of an :class:`EngineBatch` the engine's IO manager made.
        """
        ...

    def summarize(self, scope: Scope, final: bool = False) -> Summary:
        """The window's counts (and, for a merge, its keys') once this writer holds the window.

        ``final``: the merge's keys living elsewhere counted again right before the commit,
        for engines that declare ``recheck_keys_at_commit``.
        """
        ...

    def write(self, plan: WritePlan, on_stage: Callable[[str], None]) -> Written:
        """Create, claim, change the schema, then replace or merge the window; nothing commits."""
        ...


@runtime_checkable
class Profiles(Protocol):
    """A transaction that counts the batch's profile with work it does anyway, where it can.

    Spark's job that evaluates a DataFrame observes its NULL keys and partition values, and a
    merge's join with the stored rows counts its duplicate keys: a scan of their own would
    read the batch once more.
    """

    def profile(self, scope: Scope) -> BatchProfile | None:
        """The batch's profile, exactly as the guards' scan counts it; ``None``: scan it."""
        ...


@runtime_checkable
class StagesInPlace(Protocol):
    """A transaction that stages a streamed batch in the table it replaces.

    DuckDB inserts the stream into the table inside the publish's transaction; the guards read
    exactly those rows, the window's old rows are counted and deleted apart from them, and a
    refusal rolls them back with everything else.
    """

    def stage_in_place(
        self,
        stream: "Stream",
        settings: WriteSettings,
        memory: str,
        progress: Callable[[str], None],
    ) -> "Spilled | None":
        """The stream inserted into its table, read as a staged batch; ``None``: stage it apart.

        ``None`` leaves the stream unread, for the engine's staged copy.
        """
        ...


@runtime_checkable
class StagesFiles(Protocol):
    """A backend that stages a streamed batch as data files of its table, outside its log.

    Delta Lake writes the stream once as a Parquet file in the table's folder; the guards read
    that file, the commit adds it, and a publish that does not commit removes it.
    """

    def stage_files(
        self,
        stream: "Stream",
        settings: WriteSettings,
        memory: str,
        progress: Callable[[str], None],
    ) -> "Spilled | None":
        """The stream written as the table's files, read as a staged batch; ``None``: apart.

        ``None`` leaves the stream unread, for the engine's staged copy.
        """
        ...


@runtime_checkable
class Backend(Protocol):
    """An engine the idempotent publish can write to and the IO managers read from."""

    capabilities: ClassVar[Capabilities]

    def begin(self, where: str) -> AbstractContextManager[Transaction]:
        """One transaction: commit when the body returns, roll back when it raises."""
        ...

    def fingerprint(
        self, table: TableRef, partition_columns: PartitionColumns, window: WriteWindow | None
    ) -> tuple[int, int] | None:
        """Count and hash sum of a table (or one window of it); ``None`` when it is absent."""
        ...

    def load(
        self,
        settings: WriteSettings,
        window: WriteWindow | None,
        nothing: bool = False,
        arrow: bool = True,
        columns: Sequence[str] | None = None,
        stream: bool = False,
    ) -> "pa.Table | pd.DataFrame | pa.RecordBatchReader | None":
        """The window's rows in partition order (every row without a window); ``None``: no table.

        ``nothing``: the table's columns and no row (a mapping to no upstream partition).
        ``arrow`` False: a pandas DataFrame, as the engine's own driver converts it.
        ``columns``: only those the table has (:func:`selected_columns`), read as the engine
        reads fewer columns; the caller refuses the ones it lacks.
        ``stream``: a reader of bounded batches instead, valid while the backend is open, so
        a window bigger than memory is read without being held whole.
        """
        ...


def selected_columns(wanted: Sequence[str] | None, stored: Iterable[str]) -> list[str] | None:
    """The stored spelling of each ``wanted`` column the table has, in the order asked.

    ``None`` (no selection) reads every column.
    """
    if wanted is None:
        return None
    by_lower = {c.lower(): c for c in stored}
    return [by_lower[c.lower()] for c in wanted if c.lower() in by_lower]


class CommitConflict(Exception):
    """A concurrent writer changed the table under this publish; nothing of it was stored.

    Raised by an optimistic engine's commit that lost, and by a backend that finds, once it
    holds the table, that a concurrent writer created or altered it after it was described:
    the publish starts over on the table as it is now, a bounded number of times.
    """


def no_stage(stage: str) -> None:
    """The ``on_stage`` hook of a production publish: nothing to inject."""
