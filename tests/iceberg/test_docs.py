"""docs/iceberg.md's Python, executed exactly as printed, block after block in one namespace."""

import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

REPO = Path(__file__).resolve().parents[2]


def blocks() -> list[str]:
    text = (REPO / "docs" / "iceberg.md").read_text()
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def test_the_iceberg_page_runs_as_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {}
    configuration, time_travel, audited, sweep = blocks()
    exec(compile(configuration, "docs/iceberg.md", "exec"), namespace)
    exec(compile(time_travel, "docs/iceberg.md", "exec"), namespace)
    day = namespace["events_of"]("2026-01-02")

    def rows(table: pa.Table) -> list[tuple]:
        return sorted(zip(*table.to_pydict().values(), strict=True))

    assert rows(namespace["as_published"]) == rows(day) == rows(namespace["same"])
    exec(compile(audited, "docs/iceberg.md", "exec"), namespace)
    stored = namespace["catalog"].load_table(("main", "events")).scan().to_arrow()
    assert rows(stored) == rows(pa.concat_tables([day, namespace["events_of"]("2026-01-03")]))
    exec(compile(sweep, "docs/iceberg.md", "exec"), namespace)
    assert (tmp_path / ".data" / "iceberg" / "catalog.db").exists()
