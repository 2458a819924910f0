"""The idempotent IO managers on Delta Lake: the Dagster plumbing over the Delta backend."""

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar, Self

from pydantic import Field, model_validator

from idem_assets.lib.backends.delta.backend import DeltaBackend
from idem_assets.lib.dagster_layer.io_manager import IdempotentIOManager
from idem_assets.lib.model.errors import ConfigurationError
from idem_assets.lib.model.settings import WriteMode, WriteSettings

#: Storage options that let two writers both commit one version (delta-rs's unsafe rename).
UNSAFE_OPTIONS = frozenset({"allow_unsafe_rename", "aws_s3_allow_unsafe_rename"})


class _DeltaIOManager(IdempotentIOManager):
    """Opens the Delta Lake backend on a directory (or an object-store URI) of tables."""

    root: str | None = Field(
        default=None,
        description=(
            "Where the Delta tables live: a local directory (created on first write) or an"
            " object-store URI such as s3://bucket/warehouse. Table schema.table is stored at"
            " <root>/<schema>/<table>. Required (or its other name, root_uri)."
        ),
    )
    root_uri: str | None = Field(
        default=None,
        description="dagster-deltalake's name for root: give either one.",
    )
    storage_options: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Options for object storage, passed to deltalake as storage_options (e.g."
            " AWS_REGION, AWS_ENDPOINT_URL); dagster-deltalake's LocalConfig, S3Config,"
            " AzureConfig and GcsConfig are taken too. Concurrent writers on S3 rely on its"
            " conditional writes, which delta-rs 1.x makes by itself: set no locking provider,"
            " and never AWS_S3_ALLOW_UNSAFE_RENAME (two writers could then both write one"
            " version). Empty for a local directory."
        ),
    )
    client_options: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "HTTP client options for object storage (dagster-deltalake's ClientConfig, or a"
            " dict such as {'timeout': '120s'}), added to storage_options."
        ),
    )
    custom_metadata: dict[str, str] = Field(
        default_factory=dict,
        description="Recorded in every commit's entry of the table's history (DESCRIBE HISTORY).",
    )
    writer_properties: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "deltalake.WriterProperties for the Parquet files written, e.g."
            " {'compression': 'ZSTD'}. Without a 'compression' the files are Snappy-compressed,"
            " as with no properties at all (delta-rs alone would write them uncompressed)."
        ),
    )
    table_config: dict[str, str] = Field(
        default_factory=dict,
        description="Delta table properties set when a table is created (its configuration).",
    )
    writer_engine: str | None = Field(
        default=None,
        description="dagster-deltalake's writer engine: delta-rs 1.x writes with 'rust' only.",
    )
    peer_mode: str | None = Field(
        default=None,
        alias="mode",
        description=(
            "dagster-deltalake's write mode: only 'overwrite' (a partition window, replaced in"
            " one commit) is taken."
        ),
    )
    overwrite_schema: bool = Field(
        default=False,
        description=(
            "dagster-deltalake's schema overwrite: refused; metadata {'schema_evolution': ...}"
            " says which schema changes a publish may make."
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _peer_config(cls, data: Any) -> Any:
        """Take dagster-deltalake's spelling of the same settings (root_uri, its config objects)."""
        if not isinstance(data, Mapping):
            return data
        data = dict(data)
        # Dagster rebuilds the resource from the fields it was given, so root_uri stays set.
        uri = data.get("root_uri")
        if uri is not None:
            if data.get("root") not in (None, uri):
                raise ConfigurationError(
                    f"{cls.__name__} was given both root={data['root']!r} and root_uri={uri!r}."
                    " Fix: give one of them."
                )
            data["root"] = uri
        if data.get("root") is None:
            raise ConfigurationError(
                f"{cls.__name__} needs the folder or URI of its tables. Fix:"
                f" {cls.__name__}(root='warehouse/delta') (root_uri= is taken too)."
            )
        for name in ("storage_options", "client_options"):
            if data.get(name) is not None:
                data[name] = _options(data[name])
        _refuse_peer_settings(cls.__name__, data)
        return data

    @contextmanager
    def _backend(self) -> Iterator[DeltaBackend]:
        options = {**self.storage_options, **self.client_options}
        with DeltaBackend(
            self.location,
            options,
            commit_metadata=self.custom_metadata,
            writer_properties=self.writer_properties,
            table_config=self.table_config,
        ) as backend:
            yield backend

    @property
    def location(self) -> str:
        """Where the tables live (root, or root_uri as dagster-deltalake names it)."""
        assert self.root is not None  # _peer_config refuses a manager without one
        return self.root

    storage_kind: ClassVar[str] = "deltalake"

    def _location(self) -> str:
        return self.location

    def _table_name(self, settings: WriteSettings) -> str:
        """``deltalake.<schema>.<table>``, as dagster-deltalake names it."""
        return f"deltalake.{settings.schema}.{settings.table}"

    def relocated(self, directory: Path) -> Self | None:
        """The same folder name, in ``directory``; tables on object storage stay where they are."""
        if "://" in self.location:
            return None
        return self._replaced(root=str(directory / Path(self.location).name), root_uri=None)


def _options(value: Any) -> Any:
    """A dagster-deltalake config object (LocalConfig, S3Config, ...) as its string options."""
    if isinstance(value, Mapping):
        return {str(k): str(v) for k, v in value.items() if v is not None and k != "provider"}
    dump = getattr(value, "model_dump", None)
    if dump is None:
        return value
    return {k: str(v) for k, v in dump().items() if v is not None and k != "provider"}


def _refuse_peer_settings(manager: str, data: Mapping[str, Any]) -> None:
    """Refuse the dagster-deltalake settings that would make a rerun unsafe, with the fix."""
    engine = data.get("writer_engine")
    if engine is not None and getattr(engine, "value", engine) != "rust":
        raise ConfigurationError(
            f"{manager}: writer_engine={getattr(engine, 'value', engine)!r} is not available:"
            " delta-rs 1.x writes with its rust engine only. Fix: leave writer_engine out (or"
            " set it to 'rust')."
        )
    mode = data.get("mode")
    if mode is not None and getattr(mode, "value", mode) != "overwrite":
        raise ConfigurationError(
            f"{manager}: mode={getattr(mode, 'value', mode)!r} is refused: append is what this"
            " IO manager prevents (a rerun would add the same rows again), and 'error' or"
            " 'ignore' would make a rerun fail or keep stale rows. Every publish replaces its"
            " partition window in one commit. Fix: leave mode out; to upsert on a key, use"
            " ia.DeltaMergeIOManager with metadata={'primary_key': [...]}."
        )
    if data.get("overwrite_schema"):
        raise ConfigurationError(
            f"{manager}: overwrite_schema=True is refused: it would replace the table's schema"
            " (and every other partition's columns) on any write. Fix: leave overwrite_schema"
            " out and set metadata={'schema_evolution': 'add_columns'} on the assets whose new"
            " columns a publish may add; other changes are migrations the refusal prints."
        )
    given = data.get("storage_options")
    options = {str(k).lower(): str(v).lower() for k, v in dict(given or {}).items()}
    unsafe = sorted(k for k in UNSAFE_OPTIONS if options.get(k) not in (None, "false", "0", ""))
    if unsafe:
        raise ConfigurationError(
            f"{manager}: storage_options {unsafe} lets two writers both commit one version of a"
            " table, so concurrent reruns could each keep their rows. delta-rs 1.x makes"
            " conditional writes on S3 by itself. Fix: remove it from storage_options."
        )


class DeltaOverwriteIOManager(_DeltaIOManager):
    """Replaces the run's partition window with the batch in one Delta commit."""

    mode: ClassVar[WriteMode] = "overwrite"


class DeltaMergeIOManager(_DeltaIOManager):
    """Upserts the batch on 'primary_key' (stale rows of the window deleted) in one Delta merge."""

    mode: ClassVar[WriteMode] = "merge"
