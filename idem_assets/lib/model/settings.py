"""Per-asset write settings, read from asset metadata.

Settings live next to the asset (``metadata={"partition_expr": ..., "primary_key": [...]}``) so a
reader sees how an asset is written without opening the IO manager. Every error names the asset,
the key and the exact ``metadata={...}`` that fixes it.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import dagster as dg

from idem_assets.lib.model import expressions
from idem_assets.lib.model.errors import ConfigurationError
from idem_assets.lib.model.expressions import CANONICAL, Kind
from idem_assets.lib.model.identifiers import validate_identifier

WriteMode = Literal["overwrite", "merge"]
#: What a publish may change in its table's schema by itself: nothing (the default), add the
#: batch's new columns as nullable, widen a column's type where every stored value fits, or both.
SchemaEvolution = Literal["strict", "add_columns", "widen_types", "add_columns_and_widen_types"]
SCHEMA_EVOLUTIONS: tuple[SchemaEvolution, ...] = (
    "strict",
    "add_columns",
    "widen_types",
    "add_columns_and_widen_types",
)

#: Metadata keys this library reads; anything else in an asset's metadata is left alone.
PARTITION_EXPR = "partition_expr"
PRIMARY_KEY = "primary_key"
DEDUPE_ORDER_BY = "dedupe_order_by"
DELETE_MISSING = "delete_missing"
ALLOW_EMPTY = "allow_empty"
ALLOW_RUNTIME_COLUMNS = "allow_runtime_columns"
SCHEMA = "schema"
SCHEMA_EVOLUTION = "schema_evolution"

#: dagster-deltalake's metadata keys: each is refused with why (see _refuse_peer_keys).
PEER_MODE = "mode"
PEER_MODES = frozenset({"append", "error", "ignore"})
OVERWRITE_SCHEMA = "overwrite_schema"
CUSTOM_METADATA = "custom_metadata"

#: The schema of an asset whose key has no prefix and whose IO manager names none.
DEFAULT_SCHEMA = "main"


@dataclass(frozen=True)
class WriteSettings:
    """How one asset's batch is written, resolved from its metadata and the IO manager config."""

    asset: str
    mode: WriteMode
    schema: str
    table: str
    #: ``(dimension, term)`` for each partition dimension: ``""`` names the one dimension of a
    #: time-window, static or dynamic definition; a multi definition names its own. A term is a
    #: column, or an accepted ``partition_expr`` expression's canonical text.
    partition_columns: tuple[tuple[str, str], ...]
    #: The time dimension's term (a DATE or TIMESTAMP), ``None`` when there is none.
    time_column: str | None
    primary_key: tuple[str, ...]
    dedupe_order_by: tuple[str, ...]
    delete_missing: bool
    allow_empty: bool
    allow_runtime_columns: tuple[str, ...]
    schema_evolution: SchemaEvolution = "strict"
    #: The time partitions' zone: a naive timestamp holds wall-clock time in it.
    timezone: str = "UTC"

    @property
    def partition_names(self) -> tuple[str, ...]:
        """The partition terms (columns or expressions), time first."""
        rest = [c for _, c in self.partition_columns if c != self.time_column]
        return tuple(([self.time_column] if self.time_column else []) + rest)

    @property
    def adds_columns(self) -> bool:
        """Whether a publish adds the batch's new columns to the table."""
        return self.schema_evolution in ("add_columns", "add_columns_and_widen_types")

    @property
    def widens_types(self) -> bool:
        """Whether a publish widens a column whose type cannot hold the batch's values."""
        return self.schema_evolution in ("widen_types", "add_columns_and_widen_types")


def spelt_partitions(settings: WriteSettings, stored: Mapping[str, str]) -> WriteSettings:
    """``settings`` with each partition column spelt as stored (``stored``: lower-case → name)."""
    time = settings.time_column

    def spelt(name: str) -> str:
        return stored[name.lower()]

    return replace(
        settings,
        partition_columns=tuple(
            (d, expressions.respelt(c, spelt)) for d, c in settings.partition_columns
        ),
        time_column=expressions.respelt(time, spelt) if time else None,
    )


def _raw(value: Any) -> Any:
    # Dagster may hand definition metadata back wrapped in MetadataValue objects.
    return value.value if isinstance(value, dg.MetadataValue) else value


def _column_list(
    metadata: Mapping[str, Any], key: str, asset: str, example: str
) -> tuple[str, ...]:
    value = _raw(metadata.get(key))
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, Sequence) or not value:
        raise ConfigurationError(
            f"Asset '{asset}': metadata '{key}' must be a non-empty list of column names, got"
            f" {value!r}. Fix: metadata={{'{key}': {example}}}."
        )
    return tuple(
        validate_identifier(c, f"Asset '{asset}': column in metadata '{key}'") for c in value
    )


def _flag(metadata: Mapping[str, Any], key: str, default: bool, asset: str) -> bool:
    value = _raw(metadata.get(key, default))
    if not isinstance(value, bool):
        raise ConfigurationError(
            f"Asset '{asset}': metadata '{key}' must be True or False, got {value!r}."
            f" Fix: metadata={{'{key}': {default}}}."
        )
    return value


def schema_evolution(value: Any, asset: str) -> SchemaEvolution:
    """The ``schema_evolution`` metadata, one of :data:`SCHEMA_EVOLUTIONS` (``strict`` unset)."""
    value = _raw(value)
    if value is None:
        return "strict"
    if value not in SCHEMA_EVOLUTIONS:
        allowed = ", ".join(repr(v) for v in SCHEMA_EVOLUTIONS)
        raise ConfigurationError(
            f"Asset '{asset}': metadata '{SCHEMA_EVOLUTION}' must be one of {allowed}, got"
            f" {value!r}. Fix: metadata={{'{SCHEMA_EVOLUTION}': 'add_columns'}} to let a publish"
            " add the batch's new columns, or leave it out to refuse every schema change."
        )
    return value


def partition_column(
    value: Any,
    asset: str,
    kind: Kind = "time",
    dialect: str | None = CANONICAL,
    engine: str = "",
) -> str | None:
    """A one-dimensional ``partition_expr`` as a term (``None`` when absent).

    A term is a validated column name, or an accepted SQL expression's canonical text
    (:mod:`idem_assets.lib.model.expressions`), parsed in ``dialect``.
    """
    value = _raw(value)
    if value is None:
        return None
    if isinstance(value, Mapping):
        example = next(iter(value.values()), "pickup_at")
        raise ConfigurationError(
            f"Asset '{asset}': metadata '{PARTITION_EXPR}' is a dict ({dict(value)!r}), the form"
            " for a dg.MultiPartitionsDefinition, but the asset has one partition dimension."
            f" Nothing was changed. Fix: name its column, metadata={{'{PARTITION_EXPR}':"
            f" {example!r}}}; or, to scope writes by every key of the dict, partition the asset"
            " with a dg.MultiPartitionsDefinition with those dimensions."
        )
    return _term(value, asset, f"metadata '{PARTITION_EXPR}'", kind, dialect, engine)


def _term(value: Any, asset: str, what: str, kind: Kind, dialect: str | None, engine: str) -> str:
    if isinstance(value, str):
        return expressions.resolve(value, asset, what, dialect, kind, engine)
    return validate_identifier(value, f"Asset '{asset}': {what} (a column name or an expression)")


def partition_columns(
    value: Any,
    partitions_def: dg.PartitionsDefinition | None,
    asset: str,
    dialect: str | None = CANONICAL,
    engine: str = "",
) -> tuple[tuple[tuple[str, str], ...], str | None]:
    """The ``partition_expr`` metadata as ``(dimension, term)`` pairs and the time term.

    One dimension (time-window, static or dynamic partitions, or none) takes a column name or
    an expression; a ``dg.MultiPartitionsDefinition`` takes a dict naming the column (or the
    expression) of each of its dimensions, as dagster-duckdb spells it. Expressions are parsed
    in ``dialect``; ``None`` refuses them, naming ``engine``.
    """
    value = _raw(value)
    if not isinstance(partitions_def, dg.MultiPartitionsDefinition):
        timed = partitions_def is None or isinstance(
            partitions_def, dg.TimeWindowPartitionsDefinition
        )
        kind: Kind = "time" if timed else "category"
        column = partition_column(value, asset, kind, dialect, engine)
        if column is None:
            return (), None
        return (("", column),), column if timed else None
    dims = [d.name for d in partitions_def.partitions_defs]
    example = {d: f"<{d} column>" for d in dims}
    if not isinstance(value, Mapping) or sorted(value) != sorted(dims):
        got = f"got {dict(value)!r}" if isinstance(value, Mapping) else f"got {value!r}"
        raise ConfigurationError(
            f"Asset '{asset}' has a dg.MultiPartitionsDefinition with dimensions {dims}, so its"
            f" metadata '{PARTITION_EXPR}' must name the column of each dimension ({got}), or a"
            " write could not be scoped to its partitions. Nothing was changed. Fix:"
            f" metadata={{'{PARTITION_EXPR}': {example!r}}}."
        )
    timed = {
        d.name
        for d in partitions_def.partitions_defs
        if isinstance(d.partitions_def, dg.TimeWindowPartitionsDefinition)
    }
    pairs = tuple(
        (
            d,
            _term(
                value[d],
                asset,
                f"metadata '{PARTITION_EXPR}'[{d!r}]",
                "time" if d in timed else "category",
                dialect,
                engine,
            ),
        )
        for d in dims
    )
    if len({c.lower() for _, c in pairs}) < len(pairs):
        raise ConfigurationError(
            f"Asset '{asset}': metadata '{PARTITION_EXPR}' names one column for two dimensions"
            f" ({dict(pairs)!r}); each dimension needs a column of its own. Fix:"
            f" metadata={{'{PARTITION_EXPR}': {example!r}}}."
        )
    time_column = next((c for d, c in pairs if d in timed), None)
    return pairs, time_column


def resolve_settings(
    *,
    asset_key: dg.AssetKey,
    metadata: Mapping[str, Any] | None,
    mode: WriteMode,
    default_schema: str | None,
    partitioned: bool = False,
    partitions_def: dg.PartitionsDefinition | None = None,
    dialect: str | None = CANONICAL,
    engine: str = "",
) -> WriteSettings:
    """Validate an asset's metadata for ``mode`` and return its settings.

    A ``partition_expr`` expression is parsed in ``dialect``, the engine's (DuckDB's by
    default, as dagster-duckdb takes them); ``None``: engine ``engine`` evaluates none.

    The table is the key's last part. Its schema, as dagster-duckdb resolves it: the asset's
    ``schema`` metadata, else the IO manager's ``default_schema``, else the key's prefix (its
    part before the name), else ``main``. Two keys may still resolve to one table; the publish
    refuses the second asset (see ``guards.refuse_other_owner``).
    """
    md = dict(metadata or {})
    asset = asset_key.to_user_string()
    _refuse_peer_keys(md, asset)
    table = validate_identifier(asset_key.path[-1], f"Asset '{asset}': table name")
    prefix = asset_key.path[-2] if len(asset_key.path) > 1 else None
    schema = validate_identifier(
        _raw(md.get(SCHEMA)) or default_schema or prefix or DEFAULT_SCHEMA,
        f"Asset '{asset}': schema",
    )

    columns, time_column = partition_columns(
        md.get(PARTITION_EXPR), partitions_def, asset, dialect, engine
    )
    if (partitioned or partitions_def is not None) and not columns:
        raise ConfigurationError(
            f"Asset '{asset}' is partitioned but has no '{PARTITION_EXPR}' metadata, so a write"
            " could not be scoped to its partition and would replace the whole table. Fix: name"
            " the column that places each row in its partition: the DATE or TIMESTAMP column"
            f" for time partitions, e.g. metadata={{'{PARTITION_EXPR}': 'pickup_at'}}, the"
            " category column for static or dynamic ones, a dict per dimension for multi ones."
        )

    primary_key = _column_list(md, PRIMARY_KEY, asset, "['trip_id']")
    if mode == "merge" and not primary_key:
        raise ConfigurationError(
            f"Asset '{asset}' is written by the merge IO manager but has no '{PRIMARY_KEY}'"
            " metadata, so rows cannot be matched. Fix: metadata={'primary_key': ['trip_id']}"
            " (the column(s) that identify a row)."
        )
    dedupe_order_by = _column_list(md, DEDUPE_ORDER_BY, asset, "['updated_at']")
    if dedupe_order_by and not primary_key:
        raise ConfigurationError(
            f"Asset '{asset}': '{DEDUPE_ORDER_BY}' picks a winner among rows with the same key,"
            f" so it needs '{PRIMARY_KEY}' too. Fix: metadata={{'{PRIMARY_KEY}': ['trip_id'],"
            f" '{DEDUPE_ORDER_BY}': {list(dedupe_order_by)!r}}}."
        )

    return WriteSettings(
        asset=asset,
        mode=mode,
        schema=schema,
        table=table,
        partition_columns=columns,
        time_column=time_column,
        primary_key=primary_key,
        dedupe_order_by=dedupe_order_by,
        delete_missing=_flag(md, DELETE_MISSING, True, asset),
        allow_empty=_flag(md, ALLOW_EMPTY, False, asset),
        allow_runtime_columns=_column_list(md, ALLOW_RUNTIME_COLUMNS, asset, "['loaded_at']"),
        schema_evolution=schema_evolution(md.get(SCHEMA_EVOLUTION), asset),
        timezone=_timezone(partitions_def),
    )


def _refuse_peer_keys(md: Mapping[str, Any], asset: str) -> None:
    """Refuse dagster-deltalake's metadata keys that would change how a rerun writes."""
    mode = _raw(md.get(PEER_MODE))
    if isinstance(mode, str) and mode in PEER_MODES:
        raise ConfigurationError(
            f"Refused to write asset '{asset}': metadata {{'{PEER_MODE}': {mode!r}}} asks for"
            f" dagster-deltalake's '{mode}' write. "
            + (
                "Append is what this IO manager prevents: a rerun would add the partition's"
                " rows again."
                if mode == "append"
                else "It would make a rerun fail, or keep the rows it should replace."
            )
            + f" Nothing was changed. Fix: remove '{PEER_MODE}' from the metadata (every"
            " publish replaces the run's partitions in one commit); to add rows without"
            " removing others, use the merge IO manager with metadata={'primary_key':"
            " ['id'], 'delete_missing': False}."
        )
    if _raw(md.get(OVERWRITE_SCHEMA)):
        raise ConfigurationError(
            f"Refused to write asset '{asset}': metadata '{OVERWRITE_SCHEMA}' would replace the"
            " table's schema, and every other partition's columns with it. Nothing was"
            f" changed. Fix: remove '{OVERWRITE_SCHEMA}' and set metadata={{'{SCHEMA_EVOLUTION}':"
            " 'add_columns'}} to let a publish add the batch's new columns; other changes are"
            " migrations the refusal of the batch prints."
        )
    if md.get(CUSTOM_METADATA) is not None:
        raise ConfigurationError(
            f"Refused to write asset '{asset}': metadata '{CUSTOM_METADATA}' is read from the"
            " IO manager here, for every commit it makes. Nothing was changed. Fix: move it to"
            " the IO manager, ia.DeltaOverwriteIOManager(root=..., custom_metadata={...}), and"
            f" remove '{CUSTOM_METADATA}' from the metadata."
        )


def _timezone(partitions_def: dg.PartitionsDefinition | None) -> str:
    """The zone of the definition's time dimension (UTC without one)."""
    if isinstance(partitions_def, dg.MultiPartitionsDefinition):
        timed = [
            d.partitions_def
            for d in partitions_def.partitions_defs
            if isinstance(d.partitions_def, dg.TimeWindowPartitionsDefinition)
        ]
        partitions_def = timed[0] if timed else None
    if isinstance(partitions_def, dg.TimeWindowPartitionsDefinition):
        return partitions_def.timezone or "UTC"
    return "UTC"
