"""The idempotent IO managers on Spark: the Dagster plumbing over the Spark backend.

An asset may return a Spark DataFrame, which never leaves Spark (staged, checked and written
by Spark jobs), or pandas, Arrow or Polars, converted through Arrow. An input typed
``pyspark.sql.DataFrame`` gets the window's rows as a lazy DataFrame read with partition
pruning; any other input is read as the shared IO manager reads it.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, ClassVar

import dagster as dg
import pyarrow as pa
from pydantic import Field
from pyspark.sql import DataFrame

from idem_assets.lib.backends.spark.backend import SparkBackend
from idem_assets.lib.backends.spark.frames import SparkFrame
from idem_assets.lib.backends.spark.session import SPARK_CONF_FIELD, spark_session
from idem_assets.lib.dagster_layer.io_manager import (
    IdempotentIOManager,
    input_columns,
    refuse_missing_columns,
)
from idem_assets.lib.model.errors import ConfigurationError
from idem_assets.lib.model.settings import WriteMode, WriteSettings
from idem_assets.lib.write.seam import EngineBatch
from idem_assets.lib.write.streams import Spilled, Stream

#: The DataFrames evaluated for the output being handled: their copies go once it is handled.
_EVALUATED: ContextVar[list[SparkFrame] | None] = ContextVar("idem_spark_frames", default=None)


class _SparkIOManager(IdempotentIOManager):
    """Opens the Spark backend on the process's session."""

    storage_kind: ClassVar[str] = "spark"

    spark_conf: dict[str, str] = SPARK_CONF_FIELD
    warehouse: str | None = Field(
        default=None,
        description=(
            "Where a schema the catalog lacks is created (<warehouse>/<schema>.db); unset, the"
            " session's spark.sql.warehouse.dir. Existing schemas keep their own location."
        ),
    )

    @contextmanager
    def _backend(self) -> Iterator[SparkBackend]:
        with SparkBackend(spark_session(self.spark_conf), self.warehouse) as backend:
            yield backend

    def _location(self) -> str:
        return f"Spark's catalog (warehouse {self.warehouse or 'of the session'})"

    def _table_name(self, settings: WriteSettings) -> str:
        """``spark_catalog.<schema>.<table>``, as Spark names a table of its session catalog."""
        return f"spark_catalog.{settings.schema}.{settings.table}"

    def _batch(
        self, obj: object, settings: WriteSettings
    ) -> pa.Table | EngineBatch | Stream | Spilled:
        if isinstance(obj, DataFrame):
            # A Spark DataFrame stays in Spark: evaluated once, into its table's version area.
            with self._backend() as backend:
                batch = backend.evaluate(obj, settings)
            evaluated = _EVALUATED.get()
            if evaluated is not None:
                evaluated.append(batch.frame)
            return batch
        # A stream is staged in DuckDB on the driver, whose disk Spark's executors read in
        # local mode only.
        batch = super()._batch(obj, settings)
        if isinstance(batch, Stream | Spilled):
            refuse_stream_on_cluster(spark_session(self.spark_conf), settings.asset)
        return batch

    def handle_output(self, context: dg.OutputContext, obj: object) -> None:
        """Publish the batch; a DataFrame's evaluated copy is deleted unless a commit kept it.

        A refusal can come before the publish stages the copy, and a publish that lost every
        commit leaves it for a retry that does not come.
        """
        evaluated: list[SparkFrame] = []
        token = _EVALUATED.set(evaluated)
        try:
            super().handle_output(context, obj)
        finally:
            _EVALUATED.reset(token)
            for frame in evaluated:
                frame.discard()

    def load_input(self, context: dg.InputContext) -> Any:
        """A Spark DataFrame of the window for an input typed so; else the shared loader's."""
        if context.dagster_type.typing_type is not DataFrame:
            return super().load_input(context)
        settings = self._settings(context)
        window = self._window(context, settings)
        nothing = context.has_asset_partitions and not context.asset_partition_keys
        columns = input_columns(context, settings.asset)
        with self._backend() as backend:
            frame = backend.frame(settings, window, nothing, columns)
        if frame is None:
            raise dg.Failure(
                f"Asset '{settings.asset}' has no table {settings.schema}.{settings.table} in"
                f" {self._location()} yet. Materialize it first, then rerun."
            )
        refuse_missing_columns(context, settings, columns, frame.columns)
        return frame


def refuse_stream_on_cluster(spark: Any, asset: str) -> None:
    """Refuse a streamed batch where Spark's executors cannot read the driver's disk."""
    master = spark.sparkContext.master
    if not master.startswith("local"):
        raise ConfigurationError(
            f"Refused to write asset '{asset}': it returned a stream (a RecordBatchReader, an"
            " iterator of batches, a Polars LazyFrame or a DuckDB relation), which is staged on"
            f" the driver's disk, and Spark's executors ({master}) cannot read that disk."
            " Nothing was changed. Fix: return a Spark DataFrame (e.g."
            " spark.read.parquet(...) or spark.sql(...)), which Spark stages and judges on its"
            " executors without the driver holding it."
        )


class SparkOverwriteIOManager(_SparkIOManager):
    """Replaces the run's partition window with the batch: one metastore call swaps it in."""

    mode: ClassVar[WriteMode] = "overwrite"


class SparkMergeIOManager(_SparkIOManager):
    """Upserts the batch on 'primary_key' (stale rows of the window deleted), without Delta."""

    mode: ClassVar[WriteMode] = "merge"
