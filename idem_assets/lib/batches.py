"""What an asset returns, as the Arrow table every guard and backend reads."""

from typing import Any

import pyarrow as pa

from idem_assets.lib.errors import SchemaMismatchError


def to_arrow(obj: object, asset: str) -> pa.Table:
    """Accept a pyarrow Table or a pandas DataFrame; refuse anything else."""
    if isinstance(obj, pa.Table):
        return obj
    if isinstance(obj, pa.RecordBatch):
        return pa.Table.from_batches([obj])
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - pandas is a dependency
        pd = None
    if pd is not None and isinstance(obj, pd.DataFrame):
        return pa.Table.from_pandas(_index_as_columns(obj, asset), preserve_index=False)
    raise TypeError(
        f"Asset '{asset}' returned {type(obj).__name__}; the idempotent IO managers store a"
        " pandas DataFrame or a pyarrow Table. Return one of those (an empty one with the right"
        " columns if the partition really has no rows, together with"
        " metadata={'allow_empty': True})."
    )


def _index_as_columns(frame: Any, asset: str) -> Any:
    """Named index levels become columns, as ``reset_index`` makes them; unnamed ones are dropped.

    A named index holds data (``groupby("zone")`` puts the zones there); an unnamed one is only
    row numbering.
    """
    named = [n for n in frame.index.names if n is not None]
    if not named:
        return frame
    clash = [n for n in named if n in frame.columns]
    if clash:
        raise SchemaMismatchError(
            f"Refused to write asset '{asset}': the DataFrame's index level(s) {clash} have the"
            " name of a column too, so the index cannot be stored next to it. Nothing was"
            " changed. Fix: drop the index if it is only row numbering"
            " (df.reset_index(drop=True)), or rename it (df.rename_axis('other_name'))."
        )
    return frame.reset_index(level=named)
