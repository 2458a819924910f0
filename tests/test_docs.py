"""The README and docs/ hold together: links resolve, every block is run or marked, and so on.

Every fenced block says what it is. A ```bash block's commands, a ```python block and a ```sql
block are run exactly as printed by the test :data:`RUN_BY` names (``bash requires-docker`` and
``bash requires-cluster`` are tests/deploy/test_docs.py's to police); a block that is shown and
never run is marked ``text``, ``yaml``, or ``python fragment`` / ``sql fragment`` (a piece of a
program, highlighted, not runnable alone).
"""

import ast
import inspect
import re
from pathlib import Path
from typing import Any

import dagster as dg
import duckdb
import pandas as pd
import pyarrow as pa
import pytest

import idem_assets as ia
from idem_assets.lib.backends import registry
from idem_assets.lib.model import errors, settings
from tests.helpers import REPO_ROOT, doc_python

DOCS = sorted([REPO_ROOT / "README.md", *(REPO_ROOT / "docs").rglob("*.md")])
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
#: Languages a block may have, and the markers each allows after the language.
MARKERS = {
    "bash": {"", "requires-docker", "requires-cluster"},
    "python": {"", "fragment"},
    "sql": {"", "fragment"},
    "text": {""},
    "yaml": {""},
}
#: Run by tests/deploy/test_docs.py's rules (never run here: no Docker daemon, no cluster).
NOT_RUN_HERE = {"requires-docker", "requires-cluster"}

FIRST_HOUR = (
    "tests/e2e/test_first_hour.py::"
    "test_documented_commands_run_verbatim_and_their_runs_succeed_one_at_a_time"
)
#: Which test runs each shell command a page prints, exactly as printed.
RUN_BY: dict[str, dict[str, str]] = {
    "README.md": {
        "make demo": "tests/defs/test_demo.py::test_demo_runs_end_to_end_in_its_own_folders",
    },
    "docs/code-location.md": {
        "dg check defs": FIRST_HOUR,
        "dg launch --job taxi_daily --partition 2026-01-01": FIRST_HOUR,
        "dg launch --assets raw_trips --partition 2026-01-02": FIRST_HOUR,
    },
    "docs/backfills.md": {
        "dagster job backfill -w workspace.yaml -j taxi_daily --from 2026-01-01 --to 2026-01-05"
        " --noprompt": FIRST_HOUR,
        "dg launch --assets revenue_running_total --partition 2026-01-05": FIRST_HOUR,
    },
    "docs/rerun-plan.md": {
        command: (
            "tests/defs/test_rerun_plan.py::"
            "test_the_documented_backfill_plan_runs_as_printed_and_prints_its_table"
        )
        for command in (
            "python -m idem_assets.landing generate --start 2026-01-01 --end 2026-01-31",
            "dagster job execute -m idem_assets.definitions -j taxi_daily --tags"
            ' \'{"dagster/asset_partition_range_start": "2026-01-01",'
            ' "dagster/asset_partition_range_end": "2026-01-31"}\'',
            "python -m idem_assets.landing mess --day 2026-01-15 --correct",
            "dagster job execute -m idem_assets.definitions -j taxi_daily --tags"
            ' \'{"idem/plan": "true", "dagster/defer_asset_events": "true",'
            ' "dagster/asset_partition_range_start": "2026-01-01",'
            ' "dagster/asset_partition_range_end": "2026-01-31"}\'',
        )
    },
    "docs/bad-inputs.md": {
        ".venv/bin/python -m pytest tests/reliability/test_bad_inputs.py -q -p no:cacheprovider": (
            "tests/test_docs_commands.py::test_the_bad_input_catalogue_command_runs_as_printed"
        ),
    },
    "docs/deploy.md": {
        ".venv/bin/python -m pytest tests/deploy/test_compose.py tests/deploy/test_helm.py -q"
        " -p no:cacheprovider": "tests/deploy/test_docs.py::test_each_command_runs_as_printed",
    },
    "docs/postgres.md": {
        "IDEM_WAREHOUSE=postgres dg launch --job taxi_daily --partition 2026-01-01": (
            "tests/defs/test_warehouse.py::test_the_documented_postgres_switch_runs_as_printed"
        ),
        "dagster instance concurrency set duckdb_warehouse 1": (
            "tests/e2e/test_postgres_instance.py::"
            "test_a_backfill_runs_on_the_postgres_instance_through_the_grpc_code_server"
        ),
        "dagster job backfill -w deploy/workspace.yaml -j taxi_daily --partitions"
        " 2026-01-01,2026-01-02,2026-01-03 --noprompt": (
            "tests/e2e/test_postgres_instance.py::"
            "test_a_backfill_runs_on_the_postgres_instance_through_the_grpc_code_server"
        ),
        "make postgres-deps": "tests/postgres/test_postgres_server.py::"
        "test_the_documented_install_command_does_nothing_once_postgres_is_there",
    },
    "docs/delta.md": {
        "IDEM_WAREHOUSE=delta dg launch --job taxi_daily --partition 2026-01-01": (
            "tests/defs/test_warehouse.py::test_the_documented_delta_switch_runs_as_printed"
        ),
    },
    "docs/coming-from-dagster-io-managers.md": {
        "make peer-suites": (
            "tests/test_peer_suites.py::"
            "test_make_peer_suites_runs_as_printed_and_the_page_quotes_its_counts"
        ),
    },
    "docs/iceberg.md": {
        "IDEM_WAREHOUSE=iceberg dg launch --job taxi_daily --partition 2026-01-01": (
            "tests/iceberg/test_warehouse_setting.py::test_the_docs_iceberg_switch_runs_as_printed"
        ),
    },
    "docs/spark.md": {
        "make java-deps": "tests/spark/test_docs.py::test_the_java_command_runs_as_printed",
        "IDEM_WAREHOUSE=spark dg launch --job taxi_daily --partition 2026-01-01": (
            "tests/spark/test_warehouse_setting.py::test_the_docs_spark_switch_runs_as_printed"
        ),
    },
}
#: Printed commands no test runs, and why.
NEVER_RUN = {("README.md", "make test"): "it runs the whole suite, this test among them"}

#: Which test runs each ```python and ```sql block, by page and the heading above it.
BLOCKS_RUN_BY: dict[tuple[str, str], str] = {
    ("README.md", "## Ten lines"): (
        "tests/test_docs.py::test_the_readme_example_replaces_its_day_and_refuses_a_stray_row"
    ),
    ("docs/tutorial.md", "## Using the library"): (
        "tests/test_docs.py::test_the_tutorial_example_merges_and_audits_as_printed"
    ),
    ("docs/tutorial.md", "### Static, dynamic and multi-dimensional partitions"): (
        "tests/lib/test_tutorial_partitions.py::"
        "test_the_tutorial_multi_partition_example_replaces_exactly_its_keys"
    ),
    ("docs/postgres.md", "### An asset on PostgreSQL"): (
        "tests/postgres/test_docs.py::test_the_postgres_example_runs_as_printed"
    ),
    ("docs/postgres.md", "### Types, privileges, cost"): (
        "tests/postgres/test_refusals.py::test_a_role_owning_only_its_schema_writes_merges_and_reruns"
    ),
    ("docs/delta.md", "## The IO managers"): (
        "tests/delta/test_docs_delta.py::test_the_documented_delta_configuration_runs_as_printed"
    ),
    **{
        (
            "docs/iceberg.md",
            heading,
        ): "tests/iceberg/test_docs.py::test_the_iceberg_page_runs_as_printed"
        for heading in (
            "## Configuration",
            "## Time travel to exactly what a publish wrote",
            "## Write-audit-publish on a branch",
            "## Orphan files",
        )
    },
    ("docs/spark.md", "## Configuration"): (
        "tests/spark/test_docs.py::"
        "test_the_cluster_configuration_builds_definitions_without_starting_spark"
    ),
    ("docs/streaming.md", "## An asset that streams"): (
        "tests/lib/test_streams.py::test_the_streaming_page_example_runs_as_printed"
    ),
    ("docs/testing.md", "## A first proof"): (
        "tests/test_testing_kit.py::test_the_documented_kit_example_runs_as_printed"
    ),
    ("docs/outbox.md", "## In short"): (
        "tests/test_testing_kit.py::test_the_documented_outbox_example_sends_once_per_content"
    ),
}


def page(path: Path) -> str:
    """A page's name from the repository root, as the registries spell it."""
    return path.relative_to(REPO_ROOT).as_posix()


def blocks(path: Path) -> list[tuple[str, str, str, str]]:
    """(language, marker, heading above, body) of each fenced block of a page."""
    text = path.read_text()
    found = []
    for match in FENCE.finditer(text):
        language, _, marker = match.group(1).strip().partition(" ")
        headings = re.findall(r"^#{1,6} .*$", text[: match.start()], flags=re.MULTILINE)
        found.append((language, marker.strip(), headings[-1] if headings else "", match.group(2)))
    return found


def commands(body: str) -> list[str]:
    """The commands of a shell block, without comments (whole lines or trailing) or blank lines."""
    lines = [re.sub(r"\s+#\s.*$", "", line).strip() for line in body.splitlines()]
    return [line for line in lines if line and line[0] != "#"]


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lstrip("#").strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor on a page (outside fenced blocks)."""
    text = FENCE.sub("", path.read_text())
    return {slug(h) for h in re.findall(r"^#{1,6} .*$", text, flags=re.MULTILINE)}


def test_every_fenced_block_says_what_it_is() -> None:
    for path in DOCS:
        text = path.read_text()
        # Every opening fence names a language: a bare one hides a command from every rule.
        assert len(re.findall(r"^```\S", text, re.MULTILINE)) * 2 == text.count("\n```"), page(path)
        for language, marker, heading, _ in blocks(path):
            assert marker in MARKERS.get(language, set()), (page(path), heading, language, marker)


def test_every_printed_command_is_run_by_a_test() -> None:
    printed: dict[str, list[str]] = {}
    for path in DOCS:
        for language, marker, _, body in blocks(path):
            if language == "bash" and marker not in NOT_RUN_HERE:
                printed.setdefault(page(path), []).extend(commands(body))
    unrun = [
        (doc, c)
        for doc, cs in printed.items()
        for c in cs
        if c not in RUN_BY.get(doc, {}) and (doc, c) not in NEVER_RUN
    ]
    assert unrun == [], "commands no test runs; add the test and a RUN_BY entry"
    stale = [(d, c) for d, cs in RUN_BY.items() for c in cs if c not in printed.get(d, [])]
    assert stale == [], "RUN_BY names commands no page prints any more"


def test_every_python_and_sql_block_is_run_by_a_test_or_marked_a_fragment() -> None:
    printed = [
        (page(path), heading)
        for path in DOCS
        for language, marker, heading, _ in blocks(path)
        if language in ("python", "sql") and marker != "fragment"
    ]
    assert len(printed) == len(set(printed)), "one runnable block per heading"
    assert sorted(set(printed) - set(BLOCKS_RUN_BY)) == [], "blocks no test runs"
    assert sorted(set(BLOCKS_RUN_BY) - set(printed)) == [], "BLOCKS_RUN_BY names gone blocks"


def test_every_test_the_registries_name_exists() -> None:
    named = {*(t for cs in RUN_BY.values() for t in cs.values()), *BLOCKS_RUN_BY.values()}
    for node in named:
        file, _, name = node.partition("::")
        tree = ast.parse((REPO_ROOT / file).read_text())
        defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        assert name in defined, node


def test_every_relative_link_resolves() -> None:
    broken = []
    for path in DOCS:
        text = FENCE.sub("", path.read_text())
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            linked = (path.parent / file).resolve() if file else path
            if not linked.exists():
                broken.append((page(path), target))
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append((page(path), target))
    assert broken == []


def test_the_error_catalogue_lists_exactly_the_classes_errors_py_defines() -> None:
    defined = [
        name
        for name, value in vars(errors).items()
        if inspect.isclass(value)
        and issubclass(value, Exception)
        and value.__module__ == errors.__name__
    ]
    text = (REPO_ROOT / "docs" / "reference" / "errors.md").read_text()
    listed = re.findall(r"^## `(\w+)`$", text, flags=re.MULTILINE)
    # Each with its when and its fix, in the order errors.py defines them.
    assert listed == defined
    for section in text.split("\n## `")[1:]:
        assert "**When:**" in section and "**Fix:**" in section, section[:60]
    assert all(getattr(ia, name) is getattr(errors, name) for name in defined)


def test_the_settings_reference_lists_every_metadata_key_and_io_manager_field() -> None:
    text = (REPO_ROOT / "docs" / "reference" / "settings.md").read_text()
    metadata = text.split("\n## Asset metadata\n", 1)[1].split("\n## ", 1)[0]
    fields = text.split("\n## IO manager fields\n", 1)[1].split("\n## ", 1)[0]
    keys = re.findall(r"^#: Metadata keys.*?\n\n", inspect.getsource(settings), re.M | re.S)
    read = re.findall(r'^[A-Z_]+ = "(\w+)"$', keys[0], flags=re.MULTILINE)
    assert read and [k for k in read if f"| `{k}` |" not in metadata] == []
    listed = set(re.findall(r"^\|[^|]*\| `(\w+)` \|", fields, flags=re.MULTILINE))
    managers = [n for n in registry.exports() if n.endswith("IOManager")]
    for name in managers:
        manager = getattr(ia, name)
        declared = {f.alias or n for n, f in manager.model_fields.items()}
        assert declared - listed == set(), name
        assert f"`{name}`" in fields or declared == {"schema"}, name


def test_each_engine_has_its_page_and_a_row_in_the_readme() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    table = readme.split("\n## Engines\n", 1)[1].split("\n## ", 1)[0]
    for engine, module in registry.engines().items():
        assert (REPO_ROOT / "docs" / f"{engine}.md").exists(), engine
        rows = [line for line in table.splitlines() if f"(docs/{engine}.md)" in line]
        assert len(rows) == 1, engine
        for name in getattr(module, "EXPORTS", {}):
            if name.endswith("IOManager"):
                assert f"`ia.{name}`" in rows[0], name


def test_the_readme_stays_short() -> None:
    assert len((REPO_ROOT / "README.md").read_text().splitlines()) <= 220


def run(code: str, doc: str) -> dict[str, Any]:
    """Execute a printed block; its module-level names."""
    namespace: dict[str, Any] = {}
    exec(compile(code, doc, "exec"), namespace)
    return namespace


def stored(database: Path, table: str) -> list[tuple[Any, ...]]:
    """Every row of ``main.<table>``, sorted."""
    with duckdb.connect(str(database), read_only=True) as conn:
        return conn.execute(f'SELECT * FROM main."{table}" ORDER BY ALL').fetchall()


def test_the_readme_example_replaces_its_day_and_refuses_a_stray_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code = doc_python("## Ten lines", doc="README.md")
    assert len([line for line in code.splitlines() if line.strip()]) <= 12
    namespace = run(code, "README.md")
    resources = namespace["defs"].resources
    for _ in range(2):
        result = dg.materialize(
            [namespace["orders"]], resources=resources, partition_key="2026-01-02"
        )
        assert result.success
    assert stored(tmp_path / "warehouse.duckdb", "orders") == [(pd.Timestamp("2026-01-02"), 2)]

    # The README's claim: a row dated 2026-01-01 in that day's run is refused, nothing changed.
    @dg.asset(name="orders", partitions_def=namespace["daily"], metadata={"partition_expr": "day"})
    def with_a_stray_row() -> pd.DataFrame:
        return pd.DataFrame({"day": [pd.Timestamp("2026-01-01")], "orders": [2]})

    with pytest.raises(ia.StrayRowsError, match="Nothing was changed"):
        dg.materialize([with_a_stray_row], resources=resources, partition_key="2026-01-02")
    assert stored(tmp_path / "warehouse.duckdb", "orders") == [(pd.Timestamp("2026-01-02"), 2)]


def test_the_tutorial_example_merges_and_audits_as_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    namespace = run(doc_python("## Using the library"), "docs/tutorial.md")
    trips, resources = namespace["trips"], namespace["defs"].resources
    late = pd.Timestamp("2026-01-02 23:00")

    def raw(rows: list[tuple[str, int, Any]]) -> dg.AssetsDefinition:
        @dg.asset(
            name="raw_trips",
            partitions_def=namespace["daily"],
            io_manager_key="overwrite_io_manager",
            metadata={"partition_expr": "pickup_at"},
        )
        def raw_trips() -> pa.Table:
            ids, counts, stamps = zip(*rows, strict=True)
            return pa.table(
                {
                    "trip_id": list(ids),
                    "passenger_count": list(counts),
                    "pickup_at": list(stamps),
                    "updated_at": list(stamps),
                }
            )

        return raw_trips

    first = [("T1", 1, late), ("T2", 2, late)]
    for _ in range(2):
        dg.materialize([raw(first), trips], resources=resources, partition_key="2026-01-02")
    assert [r[0] for r in stored(tmp_path / "warehouse.duckdb", "trips")] == ["T1", "T2"]

    # A passenger count of 9 fails a blocking check: nothing of the batch is published.
    with pytest.raises(ia.BlockingCheckError, match="passenger_count_between_1_and_6"):
        dg.materialize(
            [raw([("T1", 1, late), ("T3", 9, late)]), trips],
            resources=resources,
            partition_key="2026-01-02",
        )
    assert [r[0] for r in stored(tmp_path / "warehouse.duckdb", "trips")] == ["T1", "T2"]


def test_every_file_the_docs_name_exists() -> None:
    """A path such as `idem_assets/lib/write/guards.py` in the prose points at a real file."""
    file = re.compile(r"\b(?:idem_assets|tests|benchmarks)/[\w/]+\.py\b")
    named = {(page(path), found) for path in DOCS for found in file.findall(path.read_text())}
    assert sorted((doc, f) for doc, f in named if not (REPO_ROOT / f).exists()) == []
