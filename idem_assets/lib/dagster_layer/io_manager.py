"""Dagster IO managers that make a rerun replace a partition instead of adding to it.

:class:`IdempotentIOManager` is the Dagster plumbing (settings, windows, metadata, the
missing-upstream check) over any :class:`~idem_assets.lib.write.seam.Backend`; an engine's IO
managers only say how to open its backend (and, for the rerun-safety kit, how to move it).
"""

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self

import dagster as dg
import pyarrow as pa
from pydantic import Field

from idem_assets.lib.dagster_layer.data_versions import record_data_version
from idem_assets.lib.dagster_layer.frames import (
    from_arrow,
    from_parquet,
    reads_arrow,
    streams,
    to_arrow,
)
from idem_assets.lib.dagster_layer.op_outputs import op_settings, op_window
from idem_assets.lib.dagster_layer.plan import (
    plan_output,
    plan_run,
    planned_input,
    planned_upstream,
)
from idem_assets.lib.model.errors import ConfigurationError, MissingUpstreamError
from idem_assets.lib.model.identifiers import validate_identifier
from idem_assets.lib.model.settings import (
    WriteMode,
    WriteSettings,
    resolve_settings,
)
from idem_assets.lib.model.windows import (
    PartitionWindow,
    WriteWindow,
    window_from_context,
    window_from_keys,
)
from idem_assets.lib.write.guards import refuse_unsupported_expressions
from idem_assets.lib.write.publish import PartitionResult, PublishResult, publish, spill_area
from idem_assets.lib.write.seam import Backend, Capabilities, EngineBatch, TableRef, probe_of
from idem_assets.lib.write.streams import (
    DEFAULT_MEMORY,
    Spilled,
    Stream,
    as_stream,
    memory_limited,
    to_parquet,
)

#: The input metadata key that selects the columns an input loads (dagster-duckdb's).
COLUMNS = "columns"


class IdempotentIOManager(dg.ConfigurableIOManager):
    """Dagster plumbing over a backend; subclasses open it and choose the write mode."""

    mode: ClassVar[WriteMode]
    #: The ``dagster/storage_kind`` of the tables (the UI's storage tag), as Dagster spells it.
    storage_kind: ClassVar[str] = ""
    #: The engine's capabilities, where its IO managers declare them before a backend opens:
    #: a ``partition_expr`` expression is then parsed in its dialect, or refused at once.
    #: ``None``: parsed in DuckDB's, and judged by the backend's own when a publish or load runs.
    capabilities: ClassVar[Capabilities | None] = None

    schema_: str | None = Field(
        default=None,
        alias="schema",
        description=(
            "Schema for every table; an asset's metadata {'schema': ...} overrides it. Unset,"
            " an asset key's prefix names the schema (['us', 'trips'] writes us.trips), and"
            " 'main' holds the tables of keys without one."
        ),
    )

    staging_memory: str = Field(
        default=DEFAULT_MEMORY,
        description=(
            "The most memory DuckDB takes while it stages and judges a streamed batch (an asset"
            " returning a pyarrow RecordBatchReader, an iterator of batches, a Polars LazyFrame"
            " or a DuckDB relation); past it, rows spill to a temporary folder, so a day bigger"
            " than the worker's memory publishes. A DuckDB size: '256MB', '1GB'."
        ),
    )

    def _backend(self) -> AbstractContextManager[Backend]:
        """Open the engine's backend for one write or load, and close it after."""
        raise NotImplementedError

    def _location(self) -> str:
        """Where the tables live, for messages (a file, a database URL)."""
        raise NotImplementedError

    def _batch(
        self, obj: object, settings: WriteSettings
    ) -> pa.Table | EngineBatch | Stream | Spilled:
        """What the asset returned as the publish takes it: Arrow, a stream, an engine's frame."""
        if isinstance(obj, Spilled):
            # Staged already, by an audited asset's checks: published from that copy.
            return obj
        return as_stream(obj, settings.asset) or to_arrow(obj, settings.asset)

    def _table_name(self, settings: WriteSettings) -> str:
        """``dagster/table_name``: the table, qualified as Dagster's IO manager for it does."""
        return f"{settings.schema}.{settings.table}"

    def relocated(self, directory: Path) -> Self | None:
        """This IO manager with its tables under ``directory``; ``None`` if they cannot move.

        The rerun-safety kit gives each trial a fresh store this way. An engine whose tables
        live on a server cannot be moved into a directory, so it says ``None``.
        """
        return None

    def _replaced(self, **fields: Any) -> Self:
        """A copy with ``fields`` changed (model_copy would keep Dagster's stored config)."""
        config = {
            (info.alias or name): getattr(self, name)
            for name, info in type(self).model_fields.items()
        }
        for name, value in fields.items():
            config[type(self).model_fields[name].alias or name] = value
        return type(self)(**config)

    def _settings(self, context: dg.OutputContext | dg.InputContext) -> WriteSettings:
        out = context if isinstance(context, dg.OutputContext) else context.upstream_output
        if not context.has_asset_key and out is not None:
            return op_settings(context, out, self.mode, self.schema_, **self._dialect())
        metadata = out.definition_metadata if out is not None else {}
        return resolve_settings(
            asset_key=context.asset_key,
            metadata=metadata,
            mode=self.mode,
            default_schema=self.schema_,
            partitions_def=context.asset_partitions_def if context.has_asset_partitions else None,
            **self._dialect(),
        )

    def _dialect(self) -> dict[str, Any]:
        """Where ``partition_expr`` expressions are parsed: the engine's dialect, and its name."""
        caps = self.capabilities
        if caps is None:
            return {}
        return {"dialect": caps.expression_dialect, "engine": caps.engine}

    def _window(
        self, context: dg.OutputContext | dg.InputContext, settings: WriteSettings
    ) -> WriteWindow | None:
        """The run's window of an asset's partitions, or of an op output's partitioned run."""
        if not context.has_asset_key:
            return op_window(context, settings)
        return window_from_context(context, settings.asset)

    def handle_output(self, context: dg.OutputContext, obj: object) -> None:
        """Publish the batch: guards, then replace the run's window in one transaction."""
        settings = self._settings(context)
        window = self._window(context, settings)
        batch = self._batch(obj, settings)
        if plan_run(context):
            # A plan run stages and judges the batch like a publish, and writes nothing.
            plan_output(context, self._backend, batch, settings, window, self.staging_memory)
            return
        with self._backend() as backend:
            result = publish(
                backend,
                batch,
                settings,
                window,
                memory=self.staging_memory,
                progress=context.log.info,
            )
        context.add_output_metadata(
            {
                **publish_metadata(result, settings, window),
                **table_metadata(self._table_name(settings), self.storage_kind, _schema(batch)),
                **result.committed,
            }
        )
        if not context.has_asset_key:
            return
        record_data_version(context, result.fingerprint)
        # A range run yields one materialization per partition. Dagster copies the output
        # metadata onto each of them, so the day's own counts go on each one by key.
        if window is not None:
            for part in window.partitions:
                if part.key in result.per_partition:
                    context.step_context.add_asset_metadata(
                        partition_metadata(result.per_partition[part.key], part),
                        asset_key=context.asset_key,
                        partition_key=part.key,
                    )

    def load_input(self, context: dg.InputContext) -> Any:
        """Load the window's rows (the whole table when unpartitioned), in partition order.

        An input typed ``pa.Table``, ``pl.DataFrame`` or ``pl.LazyFrame`` gets that type, read
        as Arrow without a pass through pandas; any other input gets a pandas DataFrame.
        """
        settings = self._settings(context)
        window = self._window(context, settings)
        frame_type = context.dagster_type.typing_type
        want_arrow = reads_arrow(frame_type)
        # A partition mapping can map to no upstream partition at all (the first day of a
        # self-dependent asset): that input is empty, never the whole table.
        maps_to_nothing = context.has_asset_partitions and not context.asset_partition_keys
        planned = planned_upstream(context)
        if planned is not None:
            # A plan run's input holds what its upstream's plan would have published.
            return planned_input(context, self._backend, settings, window, planned)
        columns = input_columns(context, settings.asset)
        streamed = streams(frame_type)
        with self._backend() as backend:
            refuse_unsupported_expressions(settings, backend.capabilities)
            # A streamed load sorts and reads the window in DuckDB under the staging limit.
            limit = self.staging_memory
            area = spill_area(backend).conn if streamed else None
            with memory_limited(area, limit) if area is not None else nullcontext():
                loaded = backend.load(
                    settings, window, maps_to_nothing, want_arrow, columns, stream=streamed
                )
                if isinstance(loaded, pa.RecordBatchReader):
                    # Drained into a file before anything else reads through the backend.
                    loaded = _drained(loaded)
            if loaded is None:
                # No table yet is an empty history for an asset that reads its own earlier
                # partitions (its first run); for any other input it means a missing upstream.
                if maps_to_nothing or _reads_itself(context):
                    return from_arrow(pa.table({}), frame_type) if want_arrow else _no_rows()
                raise dg.Failure(
                    f"Asset '{settings.asset}' has no table {settings.schema}.{settings.table} in"
                    f" {self._location()} yet. Materialize it first (for the partition(s) this"
                    " run reads), then rerun."
                )
            names = _names(loaded)
            refuse_missing_columns(context, settings, columns, names)
            # The instance records no materialization of an op's output: only assets are checked.
            if (
                window
                and settings.partition_columns
                and context.has_asset_key
                and not maps_to_nothing
            ):
                missing = _never_materialized(context, backend, settings, window)
                if missing:
                    raise MissingUpstreamError(_missing_message(context, settings.asset, missing))
        if isinstance(loaded, _Loaded):
            return from_parquet(loaded.path, frame_type, self.staging_memory)
        return from_arrow(loaded, frame_type) if want_arrow else loaded

    def read_asset(
        self, assets_def: dg.AssetsDefinition, keys: Sequence[str] | None = None
    ) -> pa.Table:
        """An asset's stored rows for partition ``keys`` (every row without keys), as Arrow.

        For code that reads a table outside an input (a check, an asset's own history) on
        whichever engine the IO manager writes to. No table yet reads as no rows.
        """
        key = assets_def.key
        partitions_def = assets_def.partitions_def
        settings = resolve_settings(
            asset_key=key,
            metadata=assets_def.metadata_by_key[key],
            mode=self.mode,
            default_schema=self.schema_,
            partitions_def=partitions_def,
            **self._dialect(),
        )
        window = None
        if keys and partitions_def is not None:
            window = window_from_keys(partitions_def, keys, settings.asset)
        with self._backend() as backend:
            refuse_unsupported_expressions(settings, backend.capabilities)
            table = backend.load(settings, window, keys is not None and not keys, True)
        if table is None:
            return pa.table({})
        assert isinstance(table, pa.Table)
        return table


@dataclass(frozen=True)
class _Loaded:
    """A streamed input's window, drained into a Parquet file."""

    path: str
    schema: pa.Schema


def _drained(reader: pa.RecordBatchReader) -> _Loaded:
    """A streamed load's reader written to a Parquet file a batch at a time."""
    return _Loaded(to_parquet(reader), reader.schema)


def _names(loaded: "pa.Table | _Loaded | Any") -> list[str]:
    if isinstance(loaded, pa.Table):
        return list(loaded.schema.names)
    if isinstance(loaded, _Loaded):
        return list(loaded.schema.names)
    return list(loaded.columns)


def input_columns(context: dg.InputContext, upstream: str) -> list[str] | None:
    """The input's metadata ``columns`` (dagster-duckdb's selection), validated; ``None``: all."""
    value = (context.definition_metadata or {}).get(COLUMNS)
    value = value.value if isinstance(value, dg.MetadataValue) else value
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, Sequence) or not value:
        raise ConfigurationError(
            f"Input '{context.name}' reading asset '{upstream}': metadata '{COLUMNS}' must be a"
            f" non-empty list of column names, got {value!r}. Fix:"
            f" dg.AssetIn(metadata={{'{COLUMNS}': ['a', 'b']}})."
        )
    return [validate_identifier(c, f"Input '{context.name}': column in '{COLUMNS}'") for c in value]


def refuse_missing_columns(
    context: dg.InputContext, settings: WriteSettings, wanted: list[str] | None, got: list[str]
) -> None:
    """Refuse a selection naming columns the table lacks (the engine read only the others)."""
    found = {c.lower() for c in got}
    missing = [c for c in wanted or () if c.lower() not in found]
    if missing:
        kept = [c for c in wanted or () if c.lower() in found]
        raise ConfigurationError(
            f"Refused to load asset '{settings.asset}' for input '{context.name}': metadata"
            f" '{COLUMNS}' names {missing}, which table {settings.schema}.{settings.table} does"
            f" not have. Nothing was changed. Fix: metadata={{'{COLUMNS}': {kept!r}}}, or add"
            " the column(s) to the upstream asset first."
        )


def _reader(context: dg.InputContext) -> dg.AssetsDefinition | None:
    return context.step_context.job_def.asset_layer.get_assets_def_for_node(
        context.step_context.node_handle
    )


def _reads_itself(context: dg.InputContext) -> bool:
    assets_def = _reader(context)
    return assets_def is not None and context.asset_key in assets_def.keys


def _never_materialized(
    context: dg.InputContext, backend: Backend, settings: WriteSettings, window: WriteWindow
) -> list[str]:
    """Upstream partitions of ``window`` with neither a materialization nor a row."""
    # The instance knows a partition materialised empty; rows prove one that another instance
    # (a test's, a restored database's) wrote. A partition with neither was never written.
    recorded = context.instance.get_latest_storage_id_by_partition(
        context.asset_key, dg.DagsterEventType.ASSET_MATERIALIZATION, set(window.keys)
    )
    # A single-run range of an asset that reads its own earlier days writes them in this run.
    this_run = _written_by_this_run(context) if _reads_itself(context) else set()
    missing = []
    for p in window.partitions:
        if p.key in recorded or p.key in this_run:
            continue
        found = backend.fingerprint(
            TableRef.of(settings),
            settings.partition_columns,
            WriteWindow((p,), window.time_dimension),
        )
        if not found or found[0] == 0:
            missing.append(p.key)
    return missing


def _written_by_this_run(context: dg.InputContext) -> set[str]:
    step = context.step_context
    if not step.has_partitions:
        return set()
    keys = context.asset_partitions_def.get_partition_keys_in_range(step.partition_key_range)
    return set(keys)


def _missing_message(context: dg.InputContext, upstream: str, missing: list[str]) -> str:
    reader = _reader(context)
    who = ", ".join(k.to_user_string() for k in reader.keys) if reader else "this step"
    shown = missing[:10] + ([f"... ({len(missing)} in all)"] if len(missing) > 10 else [])
    return (
        f"Refused to load asset '{upstream}' for '{who}': partition(s) {shown} of"
        f" '{upstream}' were never materialised, so this input would read as empty and"
        " the result would be published as if there were no data. Nothing was changed. Fix:"
        f" materialise '{upstream}' for those partition(s) first (a run of each, or a backfill"
        " of the range), then rerun this partition. A partition that was materialised empty"
        " is read as empty."
    )


def _window_text(window: WriteWindow) -> str:
    """``[start, end)`` of the time dimension, then each category dimension's values."""
    parts = [f"[{window.start.isoformat()}, {window.end.isoformat()})"] if window.timed else []
    for dim, values in window.categories().items():
        parts.append((f"{dim}=" if dim else "") + ",".join(values))
    return " ".join(parts)


def publish_metadata(
    result: PublishResult, settings: WriteSettings, window: WriteWindow | None
) -> dict[str, Any]:
    """Materialization metadata; ``dagster/row_count`` is what the UI plots per partition.

    For a range (a chunk of a backfill) the run's totals are prefixed ``range_``: each day's
    materialization gets its own counts from :func:`partition_metadata`.
    """
    md: dict[str, Any] = {
        "dagster/table_name": result.table,
        "write_mode": settings.mode,
    }
    totals: dict[str, Any] = {
        "dagster/row_count": result.rows,
        "rows_inserted": result.inserted,
        "rows_updated": result.updated,
        "rows_deleted": result.deleted,
        "fingerprint": result.fingerprint,
    }
    if window is not None:
        totals["partitions_written"] = len(result.partitions)
        totals["window"] = _window_text(window)
    if not result.per_partition:
        if window is not None:
            totals["dagster/partition_row_count"] = result.rows
        return {**md, **totals}
    totals["row_count"] = totals.pop("dagster/row_count")
    return {**md, **{f"range_{k}": v for k, v in totals.items()}}


def table_metadata(table_name: str, storage_kind: str, schema: pa.Schema) -> dict[str, Any]:
    """Dagster's table conventions: the qualified name, the storage kind, the columns written."""
    columns = [dg.TableColumn(name=f.name, type=str(f.type)) for f in schema]
    md: dict[str, Any] = {
        "dagster/table_name": table_name,
        "dagster/column_schema": dg.TableSchema(columns=columns),
    }
    if storage_kind:
        md["dagster/storage_kind"] = storage_kind
    return md


def partition_metadata(part: PartitionResult, window: PartitionWindow) -> dict[str, Any]:
    """One partition's own metadata within a range publish."""
    return {
        "dagster/row_count": part.rows,
        "dagster/partition_row_count": part.rows,
        "rows_inserted": part.inserted,
        "rows_updated": part.updated,
        "rows_deleted": part.deleted,
        "fingerprint": part.fingerprint,
        "partitions_written": 1,
        "window": _window_text(WriteWindow((window,))),
    }


def _no_rows() -> Any:
    """An empty pandas DataFrame; pandas is imported only by an input that asks for one."""
    import pandas as pd

    return pd.DataFrame()


def _schema(batch: pa.Table | EngineBatch | Stream | Spilled) -> pa.Schema:
    """The batch's Arrow schema; an engine's frame reports it through its probe."""
    if isinstance(batch, Stream | Spilled):
        return batch.schema
    return probe_of(batch).schema
