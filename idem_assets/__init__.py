"""idem_assets: Dagster IO managers and checks that make partitioned pipelines safe to rerun."""

from idem_assets.lib.audit import AuditReport, Batch, audit_table, audited_asset, stage
from idem_assets.lib.checks import (
    Check,
    between,
    freshness,
    in_window,
    not_null,
    row_count,
    unique,
)
from idem_assets.lib.connections import duckdb_connection
from idem_assets.lib.content import content_fingerprint
from idem_assets.lib.data_versions import content_changed, record_data_version
from idem_assets.lib.errors import (
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
from idem_assets.lib.io_managers import (
    DeltaMergeIOManager,
    DeltaOverwriteIOManager,
    DuckDBMergeIOManager,
    DuckDBOverwriteIOManager,
    IdempotentIOManager,
)
from idem_assets.lib.outbox import (
    Delivery,
    DeliveryRecord,
    DeliveryResult,
    Outbox,
    idempotency_key,
)
from idem_assets.lib.postgres_io_managers import (
    PostgresMergeIOManager,
    PostgresOverwriteIOManager,
)
from idem_assets.lib.publish import PublishResult, publish, table_fingerprint
from idem_assets.lib.settings import WriteSettings, resolve_settings
from idem_assets.lib.windows import PartitionWindow, WriteWindow, window_from_keys

__all__ = [
    "AuditReport",
    "Batch",
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
    "IdempotencyError",
    "IdempotentIOManager",
    "InvalidIdentifierError",
    "KeyOutsideWindowError",
    "MissingUpstreamError",
    "NullValueError",
    "Outbox",
    "OutboxError",
    "PartitionWindow",
    "PostgresMergeIOManager",
    "PostgresOverwriteIOManager",
    "PublishResult",
    "RuntimeValueError",
    "SchemaMismatchError",
    "StorageError",
    "StrayRowsError",
    "WriteSettings",
    "WriteWindow",
    "audit_table",
    "audited_asset",
    "between",
    "content_changed",
    "content_fingerprint",
    "duckdb_connection",
    "freshness",
    "idempotency_key",
    "in_window",
    "not_null",
    "publish",
    "record_data_version",
    "resolve_settings",
    "row_count",
    "stage",
    "table_fingerprint",
    "unique",
    "window_from_keys",
]
