"""docs/spark.md: its command runs as printed, and its configuration builds Definitions."""

import re
import subprocess
from pathlib import Path

import idem_assets as ia

DOC = Path(__file__).resolve().parents[2] / "docs" / "spark.md"


def blocks(kind: str) -> list[str]:
    return re.findall(rf"^```{kind}\n(.+?)\n```", DOC.read_text(), flags=re.MULTILINE | re.DOTALL)


def test_the_java_command_runs_as_printed() -> None:
    command = blocks("bash")[0]
    assert command == "make java-deps"
    done = subprocess.run(
        ["bash", "-c", command], cwd=DOC.parents[1], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=True)
    assert re.search(r'version "(1[7-9]|[2-9]\d)', java.stderr), java.stderr


def test_the_cluster_configuration_builds_definitions_without_starting_spark() -> None:
    (code,) = blocks("python")
    scope: dict[str, object] = {}
    exec(compile(code, str(DOC), "exec"), scope)
    resources = scope["defs"].resources  # type: ignore[attr-defined]
    assert isinstance(resources["io_manager"], ia.SparkOverwriteIOManager)
    assert isinstance(resources["merge_io_manager"], ia.SparkMergeIOManager)
    assert resources["spark"].spark_conf["spark.master"] == "spark://spark-master:7077"
