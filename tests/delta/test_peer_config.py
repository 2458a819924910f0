"""dagster-deltalake's configuration pasted into ours: honoured, or refused with the fix."""

import ast
import os
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dagster_deltalake import LocalConfig, S3Config, WriterEngine
from deltalake import DeltaTable

import idem_assets as ia


@dg.asset(key_prefix=["peers"])
def scores() -> pa.Table:
    return pa.table({"a": [1, 2, 3], "b": [4, 5, 6]})


def rows(path: Path) -> list[tuple]:
    table = DeltaTable(str(path)).to_pyarrow_table()
    return sorted(zip(*table.to_pydict().values(), strict=True))


def test_the_peers_fields_and_config_objects_write_their_commit_metadata_and_files(
    tmp_path: Path,
) -> None:
    manager = ia.DeltaOverwriteIOManager(
        root_uri=str(tmp_path),
        storage_options=LocalConfig(),
        writer_engine=WriterEngine.rust,
        custom_metadata={"userName": "John Doe"},
        writer_properties={"compression": "ZSTD"},
        table_config={"delta.logRetentionDuration": "interval 7 days"},
    )
    for _ in range(2):
        assert dg.materialize([scores], resources={"io_manager": manager}).success
    table = DeltaTable(str(tmp_path / "peers" / "scores"))
    assert rows(tmp_path / "peers" / "scores") == [(1, 4), (2, 5), (3, 6)]
    assert [h["userName"] for h in table.history()] == ["John Doe", "John Doe"]
    files = table.get_add_actions().column("path").to_pylist()
    assert [os.path.splitext(os.path.splitext(f)[0])[1] for f in files] == [".zstd"]
    assert table.metadata().configuration["delta.logRetentionDuration"] == "interval 7 days"


@pytest.mark.parametrize(
    ("properties", "codec"),
    [
        ({"max_row_group_size": "2"}, "SNAPPY"),
        ({"compression": "ZSTD", "max_row_group_size": "2"}, "ZSTD"),
        ({"compression": "UNCOMPRESSED", "max_row_group_size": "2"}, "UNCOMPRESSED"),
    ],
    ids=["codec left out", "codec chosen", "uncompressed chosen"],
)
def test_writer_properties_without_a_codec_keep_the_files_compressed(
    tmp_path: Path, properties: dict[str, str], codec: str
) -> None:
    """Any property set without a codec made delta-rs write uncompressed files.

    The config's values are text: a number given so failed at the first write.
    """
    manager = ia.DeltaOverwriteIOManager(root=str(tmp_path), writer_properties=properties)
    assert dg.materialize([scores], resources={"io_manager": manager}).success
    table = DeltaTable(str(tmp_path / "peers" / "scores"))
    (uri,) = table.file_uris()
    stored = pq.ParquetFile(uri.removeprefix("file://")).metadata
    # Both settings apply: two rows per row group, each column in the codec.
    assert [stored.row_group(i).num_rows for i in range(stored.num_row_groups)] == [2, 1]
    assert stored.row_group(0).column(0).compression == codec


def test_a_writer_property_that_is_no_number_is_refused_with_the_fix(tmp_path: Path) -> None:
    properties = {"max_row_group_size": "128k"}
    with pytest.raises(ia.ConfigurationError) as refused:
        dg.materialize(
            [scores],
            resources={
                "io_manager": ia.DeltaOverwriteIOManager(
                    root=str(tmp_path), writer_properties=properties
                )
            },
        )
    message = str(refused.value)
    assert "writer_properties 'max_row_group_size' is '128k', not a whole number" in message
    assert list(tmp_path.iterdir()) == []
    printed = message.split("Fix: give a whole number, e.g. writer_properties=")[1].rstrip(".")
    fixed = ia.DeltaOverwriteIOManager(
        root=str(tmp_path), writer_properties=ast.literal_eval(printed)
    )
    assert dg.materialize([scores], resources={"io_manager": fixed}).success
    assert rows(tmp_path / "peers" / "scores") == [(1, 4), (2, 5), (3, 6)]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"mode": "append"}, "append is what this IO manager prevents"),
        ({"mode": "ignore"}, "Fix: leave mode out"),
        ({"overwrite_schema": True}, "Fix: leave overwrite_schema out"),
        ({"writer_engine": "pyarrow"}, "Fix: leave writer_engine out"),
        ({"storage_options": S3Config(allow_unsafe_rename=True)}, "Fix: remove it"),
        ({"root": "a", "root_uri": "b"}, "Fix: give one of them"),
        ({"root": None}, "Fix: DeltaOverwriteIOManager(root="),
    ],
)
def test_a_peer_setting_that_makes_a_rerun_unsafe_is_refused_with_the_fix(
    tmp_path: Path, config: dict[str, Any], message: str
) -> None:
    fields = {"root": str(tmp_path), **config}
    with pytest.raises(ia.ConfigurationError, match=message.replace("(", r"\(")):
        ia.DeltaOverwriteIOManager(**fields)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ({"mode": "append"}, "Append is what this IO manager prevents"),
        ({"mode": "error"}, "Fix: remove 'mode' from the metadata"),
        ({"overwrite_schema": True}, "Fix: remove 'overwrite_schema'"),
        ({"custom_metadata": {"userName": "John Doe"}}, "Fix: move it to the IO manager"),
    ],
)
def test_a_peer_metadata_key_is_refused_and_the_table_keeps_its_rows(
    tmp_path: Path, metadata: dict[str, Any], message: str
) -> None:
    manager = ia.DeltaOverwriteIOManager(root=str(tmp_path))
    assert dg.materialize([scores], resources={"io_manager": manager}).success

    @dg.asset(key_prefix=["peers"], name="scores", metadata=metadata)
    def appended() -> pa.Table:
        return pa.table({"a": [1, 2, 3], "b": [4, 5, 6]})

    with pytest.raises(ia.ConfigurationError, match=message) as refused:
        dg.materialize([appended], resources={"io_manager": manager})
    assert str(refused.value).startswith("Refused to write asset 'peers/scores': metadata")
    assert "Nothing was changed." in str(refused.value)
    assert rows(tmp_path / "peers" / "scores") == [(1, 4), (2, 5), (3, 6)]
    assert len(DeltaTable(str(tmp_path / "peers" / "scores")).history()) == 1
