"""Errors raised when a write would make a rerun unsafe.

Every error is raised *before* anything is written, so catching one means the table is exactly as it
was. Messages name the asset, the partition(s), counts, a few sample rows and the fix.
"""


class IdempotencyError(Exception):
    """Base class: a write was refused because it would not be safe to rerun."""


class ConfigurationError(IdempotencyError):
    """Asset metadata or IO manager settings are missing or invalid."""


class InvalidIdentifierError(ConfigurationError):
    """A schema, table or column name is not a plain SQL identifier."""


class StrayRowsError(IdempotencyError):
    """The batch holds rows dated outside the run's partition window."""


class DuplicateKeyError(IdempotencyError):
    """A merge batch holds the same primary key more than once."""


class NullValueError(IdempotencyError):
    """A partition or key column holds NULL."""


class EmptyBatchError(IdempotencyError):
    """An empty batch would erase a partition that holds rows."""


class SchemaMismatchError(IdempotencyError):
    """The batch's columns or types do not match the existing table."""


class KeyOutsideWindowError(IdempotencyError):
    """A merge batch holds keys that already live in another partition."""


class RuntimeValueError(IdempotencyError):
    """The batch holds run-time values (load times, random uuids) that differ on every rerun."""


class MissingUpstreamError(IdempotencyError):
    """An input reads upstream partitions that were never materialised."""


class BlockingCheckError(IdempotencyError):
    """A blocking data-quality check failed on the staged batch, so nothing was published."""


class ConcurrentWriteError(IdempotencyError):
    """Every attempt's commit lost to a concurrent writer of the same window."""


class ConstraintViolationError(IdempotencyError):
    """Rows of the batch break a constraint the table declares (CHECK, NOT NULL)."""


class StorageError(IdempotencyError):
    """The table's storage cannot be read or written: a damaged log, no permission to write."""


class OutboxError(IdempotencyError):
    """The outbox cannot read or write its ledger (gone, corrupt, locked or read-only)."""
