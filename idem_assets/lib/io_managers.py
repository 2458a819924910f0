"""Dagster IO managers that make a rerun replace a partition instead of adding to it."""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import dagster as dg
import duckdb
import pandas as pd
import pyarrow as pa
from dagster_duckdb import DuckDBResource
from pydantic import Field

from idem_assets.lib import sql
from idem_assets.lib.duckdb_publish import PublishResult, publish, to_arrow
from idem_assets.lib.identifiers import qualified, quote
from idem_assets.lib.settings import WriteMode, WriteSettings, resolve_settings
from idem_assets.lib.windows import bound_for, window_from_context


class _IdempotentDuckDBIOManager(dg.ConfigurableIOManager):
    """Shared plumbing: connections, settings, loading; subclasses choose the write mode."""

    mode: ClassVar[WriteMode]

    database: str = Field(
        description="Path of the DuckDB database file (created on first write).",
    )
    schema_: str = Field(
        default="main",
        alias="schema",
        description="Schema for tables; an asset's metadata {'schema': ...} overrides it.",
    )
    connection_config: dict[str, Any] = Field(
        default_factory=dict,
        description="DuckDB configuration options passed to duckdb.connect (e.g. memory_limit).",
    )

    @contextmanager
    def _connect(self) -> Iterator[duckdb.DuckDBPyConnection]:
        # DuckDBResource retries while another process holds the file's writer lock; its own
        # context manager skips close() when the body raises, so close here on every path.
        resource = DuckDBResource(database=self.database, connection_config=self.connection_config)
        with resource.get_connection() as conn:
            try:
                yield conn
            finally:
                conn.close()

    def _settings(self, context: dg.OutputContext | dg.InputContext) -> WriteSettings:
        out = context if isinstance(context, dg.OutputContext) else context.upstream_output
        metadata = out.definition_metadata if out is not None else {}
        return resolve_settings(
            asset_key=context.asset_key,
            metadata=metadata,
            mode=self.mode,
            default_schema=self.schema_,
            partitioned=context.has_asset_partitions,
        )

    def handle_output(self, context: dg.OutputContext, obj: object) -> None:
        """Publish the batch: guards, then replace the run's window in one transaction."""
        settings = self._settings(context)
        window = window_from_context(context, settings.asset)
        batch = to_arrow(obj, settings.asset)
        with self._connect() as conn:
            result = publish(conn, batch, settings, window)
        context.add_output_metadata(publish_metadata(result, settings, window))

    def load_input(self, context: dg.InputContext) -> pd.DataFrame | pa.Table:
        """Load the window's rows for a partitioned input, else the whole table, in partition order."""
        settings = self._settings(context)
        window = window_from_context(context, settings.asset)
        target = qualified(settings.schema, settings.table)
        with self._connect() as conn:
            exists = conn.execute(
                "SELECT count(*) FROM information_schema.tables"
                " WHERE table_schema = ? AND table_name = ?",
                [settings.schema, settings.table],
            ).fetchone()
            if not exists or not exists[0]:
                raise dg.Failure(
                    f"Asset '{settings.asset}' has no table {settings.schema}.{settings.table} in"
                    f" {self.database} yet. Materialize it first (for the partition(s) this run"
                    " reads), then rerun."
                )
            where, params, order = "", [], ""
            if settings.partition_expr:
                order = f" ORDER BY {quote(settings.partition_expr)}"
            if window and settings.partition_expr:
                ptype = conn.execute(
                    "SELECT data_type FROM information_schema.columns WHERE table_schema = ?"
                    " AND table_name = ? AND column_name = ?",
                    [settings.schema, settings.table, settings.partition_expr],
                ).fetchone()
                spans = (
                    [(bound_for(s, ptype[0]), bound_for(e, ptype[0])) for s, e in window.spans()]
                    if ptype
                    else []
                )
                pred, params = sql.window_predicate(settings.partition_expr, spans)
                where = f" WHERE {pred}"
            relation = conn.execute(f"SELECT * FROM {target}{where}{order}", params)
            if context.dagster_type.typing_type is pa.Table:
                return relation.fetch_arrow_table()
            return relation.df()


def publish_metadata(result: PublishResult, settings: WriteSettings, window: Any) -> dict[str, Any]:
    """Materialization metadata; ``dagster/row_count`` is what the UI plots per partition."""
    md: dict[str, Any] = {
        "dagster/row_count": result.rows,
        "dagster/table_name": result.table,
        "write_mode": settings.mode,
        "rows_inserted": result.inserted,
        "rows_updated": result.updated,
        "rows_deleted": result.deleted,
        "fingerprint": result.fingerprint,
    }
    if window is not None:
        md["partitions_written"] = len(result.partitions)
        md["window"] = f"[{window.start.isoformat()}, {window.end.isoformat()})"
    return md


class DuckDBOverwriteIOManager(_IdempotentDuckDBIOManager):
    """Replaces the run's partition window with the batch in one DuckDB transaction."""

    mode: ClassVar[WriteMode] = "overwrite"


class DuckDBMergeIOManager(_IdempotentDuckDBIOManager):
    """Upserts the batch on metadata 'primary_key' and deletes the window's stale rows, in one transaction."""

    mode: ClassVar[WriteMode] = "merge"
