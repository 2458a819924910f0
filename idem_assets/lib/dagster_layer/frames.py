"""What an asset returns, as the Arrow table every guard and backend reads."""

import sys
from typing import Any

import pyarrow as pa

from idem_assets.lib.model.errors import SchemaMismatchError
from idem_assets.lib.write.streams import spill_root


def to_arrow(obj: object, asset: str) -> pa.Table:
    """Accept a pyarrow Table, a pandas DataFrame or a Polars frame; refuse anything else."""
    if isinstance(obj, pa.Table):
        return obj
    if isinstance(obj, pa.RecordBatch):
        return pa.Table.from_batches([obj])
    polars_table = _polars_to_arrow(obj)
    if polars_table is not None:
        return polars_table
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - pandas is a dependency
        pd = None
    if pd is not None and isinstance(obj, pd.DataFrame):
        return pa.Table.from_pandas(_index_as_columns(obj, asset), preserve_index=False)
    raise TypeError(
        f"Asset '{asset}' returned {type(obj).__name__}; the idempotent IO managers store a"
        " pandas DataFrame, a Polars DataFrame or LazyFrame, or a pyarrow Table. Return one of"
        " those (an empty one with the right columns if the partition really has no rows,"
        " together with metadata={'allow_empty': True})."
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


def _polars_to_arrow(obj: Any) -> pa.Table | None:
    """A Polars frame as Arrow without a copy (a LazyFrame is collected first), else ``None``."""
    # Only a process that imported Polars can hand us a Polars frame, so Polars stays optional.
    pl: Any = sys.modules.get("polars")
    if pl is None:
        return None
    frame = obj.collect() if isinstance(obj, pl.LazyFrame) else obj
    return frame.to_arrow() if isinstance(frame, pl.DataFrame) else None


def streams(frame_type: object) -> bool:
    """True when an input asks for a stream: a reader, a LazyFrame or a DuckDB relation.

    Such an input gets the window through a Parquet file it reads lazily, so a window bigger
    than memory can be loaded.
    """
    import duckdb

    pl: Any = sys.modules.get("polars")
    lazy = pl is not None and frame_type is pl.LazyFrame
    return lazy or frame_type in (pa.RecordBatchReader, duckdb.DuckDBPyRelation)


def from_parquet(path: str, frame_type: object, memory: str) -> Any:
    """The window's Parquet file as the streamed input asks for it, read as it is consumed."""
    import duckdb
    import pyarrow.parquet as pq

    if frame_type is duckdb.DuckDBPyRelation:
        # A database of the input's own, under the staging memory, spilling past it into the
        # staging folder (an in-memory database's default is '.tmp' in the working directory).
        folder = str(spill_root() / "duckdb-inputs")
        conn = duckdb.connect(config={"memory_limit": memory, "temp_directory": folder})
        return conn.read_parquet(path)
    if frame_type is pa.RecordBatchReader:
        found = pq.ParquetFile(path)
        return pa.RecordBatchReader.from_batches(found.schema_arrow, found.iter_batches())
    pl: Any = sys.modules["polars"]
    return pl.scan_parquet(path)


def reads_arrow(frame_type: object) -> bool:
    """True when an input asks for Arrow, a Polars frame or a stream: loaded without pandas."""
    pl: Any = sys.modules.get("polars")
    polars = pl is not None and frame_type in (pl.DataFrame, pl.LazyFrame)
    return frame_type is pa.Table or polars or streams(frame_type)


def from_arrow(table: pa.Table, frame_type: object) -> Any:
    """``table`` as the frame an input asks for: Arrow as is, Polars (eager or lazy) from it.

    An input that streams gets a reader of the table, or a DuckDB relation over it.
    """
    import duckdb

    pl: Any = sys.modules.get("polars")
    if pl is not None and frame_type in (pl.DataFrame, pl.LazyFrame):
        frame = pl.from_arrow(table)
        return frame.lazy() if frame_type is pl.LazyFrame else frame
    if frame_type is pa.RecordBatchReader:
        return table.to_reader()
    if frame_type is duckdb.DuckDBPyRelation:
        return duckdb.connect().from_arrow(table)
    return table
