"""What an engine must provide so the engine-neutral publish can replace a window in it.

The guards (:mod:`idem_assets.lib.write.guards`) decide every refusal on the staged Arrow batch and on
the small summaries a backend reads from its target; the backend only stages, counts, writes,
fingerprints and loads. A new engine is one module implementing :class:`Backend`, plus its
factory in ``tests/conformance/conftest.py``.
"""

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import duckdb
import pandas as pd
import pyarrow as pa

from idem_assets.lib.model.settings import WriteSettings
from idem_assets.lib.model.windows import Cell, Region, WriteWindow
from idem_assets.lib.write.schema_fit import SchemaChange

#: ``(dimension, column)`` pairs, or one column name (a one-dimensional ``partition_expr``).
PartitionColumns = Sequence[tuple[str, str]] | str | None

#: Per-partition counts of a range, or the whole window's under the key ``None``.
Counts = dict[str | None, int]


@dataclass(frozen=True)
class Target:
    """What a publish needs to know of its table before it changes anything."""

    exists: bool
    #: The asset recorded as the table's writer, or ``None`` when none claimed it yet.
    owner: str | None
    #: Whether a publish can record its asset as the owner in the commit that writes its rows;
    #: a table nobody owns that cannot be claimed so must be handed over first.
    claimable: bool = True
    #: Whether the table refuses every commit that removes rows (Delta's ``delta.appendOnly``).
    append_only: bool = False


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
class Staged:
    """The batch as it will be stored: the target's column names and types."""

    #: The name under which the backend's evaluator reads the staged rows: the batch cast to
    #: the stored types with the engine's rounding, so the guards judge the stored values.
    relation: str
    #: The settings with every column name spelt as the table spells it.
    settings: WriteSettings
    #: Each stored partition column's type (window bounds and values depend on them).
    partition_types: dict[str, pa.DataType]
    #: The schema changes the asset opted into that this batch needs (``schema_fit``); the
    #: relation is already cast to the changed types, the table is changed by ``evolve``.
    changes: tuple[SchemaChange, ...] = ()
    #: The columns stored rounded to fewer digits (the relation holds the rounded values) ...
    rounds: tuple[Rounding, ...] = ()
    #: ... and the batch as sent, under the name the evaluator reads it by ("" without any).
    sent: str = ""


@dataclass(frozen=True)
class Scope:
    """What one publish writes: the staged batch, the target and the window's bounds."""

    settings: WriteSettings
    window: WriteWindow | None
    #: "asset 'x', partition D", for messages.
    where: str
    staged: Staged
    table_exists: bool
    #: The partition columns as stored, time first; empty without a window.
    pcols: tuple[str, ...]
    #: The window as rows of those columns (empty without a window).
    region: Region
    #: A range's partitions with their boxes; empty for one partition or none.
    cells: list[Cell]

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
        return f"{self.settings.schema}.{self.settings.table}"


@runtime_checkable
class Backend(Protocol):
    """An engine the idempotent publish can write to; every method runs in its transaction."""

    #: The engine's name, for messages ("DuckDB", "Postgres").
    engine: str

    def transaction(self, where: str) -> AbstractContextManager[None]:
        """One transaction: commit when the body returns, roll back when it raises."""
        ...

    def evaluator(self) -> duckdb.DuckDBPyConnection:
        """The DuckDB connection the guards run their batch queries in (Arrow in, counts out)."""
        ...

    def describe(self, settings: WriteSettings) -> Target:
        """Whether the table exists and which asset owns it."""
        ...

    def stage(self, batch: pa.Table, settings: WriteSettings, where: str) -> Staged:
        """Cast the batch to the stored names and types (the engine's rounding), or refuse it."""
        ...

    def column_types(self, settings: WriteSettings) -> dict[str, pa.DataType] | None:
        """The table's columns as Arrow types, or ``None`` when there is no table."""
        ...

    def evolve(self, settings: WriteSettings, changes: Sequence[SchemaChange]) -> None:
        """Add the columns and widen the types of ``changes``, inside the publish transaction."""
        ...

    def count_window(self, scope: Scope) -> Counts:
        """Rows the window holds now, per partition for a range."""
        ...

    def count_keys(self, scope: Scope) -> tuple[Counts, int]:
        """Target rows whose key the batch holds: in the window (per partition), and elsewhere."""
        ...

    def keys_elsewhere_sample(self, scope: Scope) -> str:
        """A few target rows outside the window whose key the batch holds, as text."""
        ...

    def claim(self, settings: WriteSettings) -> None:
        """Record the asset as the table's owner."""
        ...

    def owners_text(self) -> str:
        """The owners table's name as a statement on this engine spells it."""
        ...

    def replace(self, scope: Scope, on_stage: Callable[[str], None]) -> int:
        """Delete the window (or the whole table), then insert the batch; returns rows written."""
        ...

    def merge(self, scope: Scope, on_stage: Callable[[str], None]) -> int:
        """Delete the batch's keys (the window's stale rows too with delete_missing), insert."""
        ...

    def fingerprints(self, scope: Scope) -> dict[str | None, tuple[int, int]]:
        """Count and hash sum of the window as stored now, per partition for a range."""
        ...

    def fingerprint_table(
        self,
        schema: str,
        table: str,
        partition_columns: PartitionColumns,
        window: WriteWindow | None,
    ) -> tuple[int, int] | None:
        """Count and hash sum of a table (or one window of it); ``None`` when it is absent."""
        ...

    def load(
        self, settings: WriteSettings, window: WriteWindow | None, nothing: bool, arrow: bool
    ) -> pa.Table | pd.DataFrame:
        """The window's rows (none when ``nothing``; the table without a window), in order."""
        ...


class CommitConflict(Exception):
    """A concurrent writer changed the table under this publish; nothing of it was stored.

    Raised by :meth:`Backend.transaction` of engines that commit optimistically (Delta Lake),
    and by a backend that finds, once it holds the table, that a concurrent writer created or
    altered it after it was described (PostgreSQL): the publish starts over on the table as it
    is now, a bounded number of times.
    """


@runtime_checkable
class ChecksKeysAtCommit(Protocol):
    """A backend whose merges could miss a concurrent writer's uncommitted keys.

    Under READ COMMITTED two merges of different partitions each count the keys living
    elsewhere without seeing the other's; both would store a shared new key. Such a backend
    counts them again right before its commit, under a lock every merge of the table holds
    from that count to its commit, so the later of two such writers sees the earlier's keys.
    """

    def keys_elsewhere_at_commit(self, scope: Scope) -> int:
        """Target rows outside the window whose key the batch holds, counted under that lock."""
        ...


@runtime_checkable
class HandsOver(Protocol):
    """A backend whose owner record is not an owners table that an ``UPDATE`` changes."""

    def handover_text(self, settings: WriteSettings) -> str:
        """Code that records ``settings.asset`` as the owner of its table."""
        ...


@runtime_checkable
class AppendOnlyTables(Protocol):
    """A backend whose tables can refuse removals (:attr:`Target.append_only`)."""

    def lift_append_only_text(self, settings: WriteSettings) -> str:
        """Code that lets ``settings.table`` take commits that remove rows."""
        ...


@runtime_checkable
class KeysInPaths(Protocol):
    """A backend that stores category keys in file paths (Hive-style ``column=value``)."""

    #: The longest file name the storage takes, in bytes; ``None`` where it sets no limit.
    name_limit: int | None

    def key_paths(self, scope: Scope) -> dict[tuple[str, object], str]:
        """The path segment each ``(column, key)`` of the window's categories is stored under."""
        ...


def no_stage(stage: str) -> None:
    """The ``on_stage`` hook of a production publish: nothing to inject."""
