"""idem_assets: Dagster IO managers and checks that make partitioned pipelines safe to rerun."""

from typing import TYPE_CHECKING, Any

from idem_assets.lib.backends import registry
from idem_assets.lib.dagster_layer.audit import (
    AuditReport,
    Batch,
    audit_table,
    audited_asset,
    stage,
)
from idem_assets.lib.dagster_layer.checks import (
    Check,
    between,
    freshness,
    in_window,
    not_null,
    row_count,
    unique,
)
from idem_assets.lib.dagster_layer.data_versions import content_changed, record_data_version
from idem_assets.lib.dagster_layer.io_manager import IdempotentIOManager
from idem_assets.lib.dagster_layer.plan import PLAN_TAG, PLAN_TAGS, run_plan
from idem_assets.lib.model.errors import (
    BlockingCheckError,
    ConcurrentWriteError,
    ConfigurationError,
    ConstraintViolationError,
    DuplicateKeyError,
    EmptyBatchError,
    IdempotencyError,
    InvalidIdentifierError,
    KeyOutsideWindowError,
    MissingUpstreamError,
    NullValueError,
    OutboxError,
    RuntimeValueError,
    SchemaMismatchError,
    StorageError,
    StrayRowsError,
)
from idem_assets.lib.model.identifiers import qualified, quote
from idem_assets.lib.model.settings import WriteMode, WriteSettings, resolve_settings
from idem_assets.lib.model.windows import PartitionWindow, WriteWindow, window_from_keys
from idem_assets.lib.outbox.content import content_fingerprint
from idem_assets.lib.outbox.outbox import (
    Delivery,
    DeliveryRecord,
    DeliveryResult,
    Outbox,
    idempotency_key,
)
from idem_assets.lib.write.plan import PartitionPlan, PublishPlan, plan
from idem_assets.lib.write.publish import PublishResult, publish, table_fingerprint
from idem_assets.lib.write.streams import Batches, batches

if TYPE_CHECKING:
    # Type checkers see every engine's names; at run time each is imported when first used.
    from idem_assets.lib.backends.delta.io_managers import (
        DeltaMergeIOManager,
        DeltaOverwriteIOManager,
    )
    from idem_assets.lib.backends.duckdb.connections import duckdb_connection
    from idem_assets.lib.backends.duckdb.io_managers import (
        DuckDBMergeIOManager,
        DuckDBOverwriteIOManager,
    )
    from idem_assets.lib.backends.iceberg.io_managers import (
        IcebergMergeIOManager,
        IcebergOverwriteIOManager,
    )
    from idem_assets.lib.backends.postgres.io_managers import (
        PostgresMergeIOManager,
        PostgresOverwriteIOManager,
    )
    from idem_assets.lib.backends.spark.io_managers import (
        SparkMergeIOManager,
        SparkOverwriteIOManager,
    )
    from idem_assets.lib.backends.spark.session import SparkResource


def __getattr__(name: str) -> Any:
    """An engine's IO manager (or helper), imported with its driver on first use."""
    if name in registry.exports():
        value = registry.exported(name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'idem_assets' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(registry.exports()))


__all__ = [
    "PLAN_TAG",
    "PLAN_TAGS",
    "AuditReport",
    "Batch",
    "Batches",
    "BlockingCheckError",
    "Check",
    "ConcurrentWriteError",
    "ConfigurationError",
    "ConstraintViolationError",
    "Delivery",
    "DeliveryRecord",
    "DeliveryResult",
    "DeltaMergeIOManager",
    "DeltaOverwriteIOManager",
    "DuckDBMergeIOManager",
    "DuckDBOverwriteIOManager",
    "DuplicateKeyError",
    "EmptyBatchError",
    "IcebergMergeIOManager",
    "IcebergOverwriteIOManager",
    "IdempotencyError",
    "IdempotentIOManager",
    "InvalidIdentifierError",
    "KeyOutsideWindowError",
    "MissingUpstreamError",
    "NullValueError",
    "Outbox",
    "OutboxError",
    "PartitionPlan",
    "PartitionWindow",
    "PostgresMergeIOManager",
    "PostgresOverwriteIOManager",
    "PublishPlan",
    "PublishResult",
    "RuntimeValueError",
    "SchemaMismatchError",
    "SparkMergeIOManager",
    "SparkOverwriteIOManager",
    "SparkResource",
    "StorageError",
    "StrayRowsError",
    "WriteMode",
    "WriteSettings",
    "WriteWindow",
    "audit_table",
    "audited_asset",
    "batches",
    "between",
    "content_changed",
    "content_fingerprint",
    "duckdb_connection",
    "freshness",
    "idempotency_key",
    "in_window",
    "not_null",
    "plan",
    "publish",
    "qualified",
    "quote",
    "record_data_version",
    "resolve_settings",
    "row_count",
    "run_plan",
    "stage",
    "table_fingerprint",
    "unique",
    "window_from_keys",
]
