"""The idempotent IO managers on Delta Lake: the Dagster plumbing over the Delta backend."""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar, Self

from pydantic import Field

from idem_assets.lib.backends.delta.backend import DeltaBackend
from idem_assets.lib.dagster_layer.io_manager import IdempotentIOManager
from idem_assets.lib.model.settings import WriteMode


class _DeltaIOManager(IdempotentIOManager):
    """Opens the Delta Lake backend on a directory (or an object-store URI) of tables."""

    root: str = Field(
        description=(
            "Where the Delta tables live: a local directory (created on first write) or an"
            " object-store URI such as s3://bucket/warehouse. Table schema.table is stored at"
            " <root>/<schema>/<table>."
        ),
    )
    storage_options: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Options for object storage, passed to deltalake as storage_options (e.g."
            " AWS_REGION, AWS_ENDPOINT_URL). Concurrent writers on S3 rely on its conditional"
            " writes, which delta-rs 1.x makes by itself: set no locking provider, and never"
            " AWS_S3_ALLOW_UNSAFE_RENAME (two writers could then both write one version)."
            " Empty for a local directory."
        ),
    )

    @contextmanager
    def _backend(self) -> Iterator[DeltaBackend]:
        with DeltaBackend(self.root, self.storage_options) as backend:
            yield backend

    def _location(self) -> str:
        return self.root

    def relocated(self, directory: Path) -> Self | None:
        """The same folder name, in ``directory``; tables on object storage stay where they are."""
        if "://" in self.root:
            return None
        return self._replaced(root=str(directory / Path(self.root).name))


class DeltaOverwriteIOManager(_DeltaIOManager):
    """Replaces the run's partition window with the batch in one Delta commit."""

    mode: ClassVar[WriteMode] = "overwrite"


class DeltaMergeIOManager(_DeltaIOManager):
    """Upserts the batch on 'primary_key' (stale rows of the window deleted) in one Delta merge."""

    mode: ClassVar[WriteMode] = "merge"
