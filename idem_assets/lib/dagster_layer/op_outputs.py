"""Where an op's output (an output with no asset key) is stored, as dagster-duckdb stores it.

The table is the output's metadata ``table``, else the output's name; the schema its metadata
``schema``, else the IO manager's, else ``main``. In a partitioned run an output that names its
``partition_expr`` replaces only the run's partitions; one that names none is refused, as its
write would replace every other partition's rows.
"""

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import dagster as dg

from idem_assets.lib.model.errors import ConfigurationError
from idem_assets.lib.model.expressions import CANONICAL
from idem_assets.lib.model.settings import (
    DEFAULT_SCHEMA,
    PARTITION_EXPR,
    SCHEMA,
    WriteMode,
    WriteSettings,
    resolve_settings,
)
from idem_assets.lib.model.windows import WriteWindow, window_from_keys

#: The output metadata key that names an op output's table (dagster-duckdb's).
TABLE = "table"


def op_output_name(out: dg.OutputContext) -> str:
    """``op.output``: the writer an op output's table records as its owner, and messages name."""
    # A mapped step's key ends in [mapping key]; every mapped copy writes the same table.
    return f"{out.step_key.split('[')[0]}.{out.name}"


def op_settings(
    context: dg.OutputContext | dg.InputContext,
    out: dg.OutputContext,
    mode: WriteMode,
    default_schema: str | None,
    dialect: str | None = CANONICAL,
    engine: str = "",
) -> WriteSettings:
    """The settings of the table op output ``out`` is written to (or ``context`` reads).

    A ``partition_expr`` expression is parsed in ``dialect`` (``None``: engine ``engine``
    evaluates none).
    """
    metadata: Mapping[str, Any] = out.definition_metadata or {}
    name = op_output_name(out)
    table = _raw(metadata.get(TABLE)) or out.name
    schema = _raw(metadata.get(SCHEMA)) or default_schema or DEFAULT_SCHEMA
    partitions_def = _run_partitions(context)
    if partitions_def is not None and metadata.get(PARTITION_EXPR) is None:
        raise ConfigurationError(
            f"Refused to write op output '{name}': the run is for partition(s)"
            f" {_run_keys(context, partitions_def)} of a partitioned job, but the output has no"
            f" '{PARTITION_EXPR}' metadata, so its write would replace every partition's rows in"
            f" {schema}.{table}. Nothing was changed. Fix: name the column that places each row"
            f" in its partition, e.g. dg.Out(metadata={{'{PARTITION_EXPR}': 'pickup_at'}})"
            " (a dict per dimension for multi partitions)."
        )
    settings = resolve_settings(
        asset_key=dg.AssetKey([schema, table]),
        metadata={**metadata, SCHEMA: schema},
        mode=mode,
        default_schema=default_schema,
        partitions_def=partitions_def,
        dialect=dialect,
        engine=engine,
    )
    return replace(settings, asset=name)


def op_window(
    context: dg.OutputContext | dg.InputContext, settings: WriteSettings
) -> WriteWindow | None:
    """The run's partitions of a partitioned run (``None``: the whole table)."""
    partitions_def = _run_partitions(context)
    if partitions_def is None:
        return None
    return window_from_keys(partitions_def, _run_keys(context, partitions_def), settings.asset)


def _run_partitions(context: dg.OutputContext | dg.InputContext) -> dg.PartitionsDefinition | None:
    step = context.step_context
    return step.run_partitions_def if step.has_partitions else None


def _run_keys(
    context: dg.OutputContext | dg.InputContext, partitions_def: dg.PartitionsDefinition
) -> list[str]:
    step = context.step_context
    if not step.has_partition_key_range:
        return [step.partition_key]
    return list(partitions_def.get_partition_keys_in_range(step.partition_key_range))


def _raw(value: Any) -> Any:
    return value.value if isinstance(value, dg.MetadataValue) else value
