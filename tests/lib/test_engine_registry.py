"""Engines are found by folder and imported when first used; the neutral core imports none."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from idem_assets.lib.backends import registry

LIB = Path(__file__).resolve().parents[2] / "idem_assets" / "lib"
#: The drivers of the engines that are extras, and the packages only deployments need.
EXTRA_MODULES = [
    "deltalake",
    "adbc_driver_postgresql",
    "psycopg2",
    "dagster_postgres",
    "dagster_webserver",
    "polars",
    "pyspark",
]


def run_python(code: str) -> str:
    """What ``code`` prints in a fresh interpreter (nothing imported before it)."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return done.stdout.strip()


def test_importing_the_library_and_the_code_location_loads_no_engine_driver() -> None:
    loaded = run_python(
        "import sys; import idem_assets, idem_assets.definitions;"
        f" print(sorted(m for m in {EXTRA_MODULES!r} if m in sys.modules))"
    )
    assert loaded == "[]"


def test_an_engines_io_manager_imports_its_driver_when_first_used() -> None:
    loaded = run_python(
        "import sys, idem_assets as ia; ia.DeltaOverwriteIOManager;"
        " print('deltalake' in sys.modules, 'adbc_driver_postgresql' in sys.modules)"
    )
    assert loaded == "True False"


def test_a_missing_engine_driver_is_named_with_the_extra_that_installs_it() -> None:
    # None in sys.modules makes importing the module fail, as when the extra is not installed.
    code = (
        "import sys; sys.modules['deltalake'] = None; import idem_assets as ia\n"
        "try:\n    ia.DeltaOverwriteIOManager\nexcept ImportError as e:\n    print(e)"
    )
    message = run_python(code)
    assert "idem_assets.DeltaOverwriteIOManager needs the delta engine's driver" in message
    assert message.endswith("Fix: pip install 'idem_assets[delta]'.")


def test_every_engine_folder_names_its_exports_and_extra() -> None:
    engines = registry.engines()
    assert {"duckdb", "postgres", "delta"} <= set(engines)
    for name, module in engines.items():
        assert module.EXPORTS, name
        # DuckDB is a core dependency: the one engine without an extra.
        assert (getattr(module, "EXTRA", None) is None) == (name == "duckdb"), name


def test_the_neutral_core_imports_no_engine_and_no_engine_imports_the_guards() -> None:
    found = []
    for path in LIB.rglob("*.py"):
        inside = path.relative_to(LIB).parts
        text = path.read_text()
        if inside[0] != "backends" and re.search(r"import.*backends\.", text):
            found.append(f"{path}: imports an engine")
        if inside[0] == "backends" and re.search(r"import.*\bguards\b", text):
            found.append(f"{path}: imports the guards")
    # The registry is the one module of backends/ the core may import, and it imports no engine.
    assert found == []


@pytest.mark.parametrize("name", sorted(registry.exports()))
def test_every_exported_name_is_reachable_from_the_package(name: str) -> None:
    import idem_assets

    assert name in idem_assets.__all__
    assert getattr(idem_assets, name) is registry.exported(name)


def test_the_example_location_uses_the_public_surface_only() -> None:
    package = LIB.parent
    example = [*(package / "defs").rglob("*.py"), *(package / "landing").rglob("*.py")]
    example += [package / "demo.py", package / "worked_example.py", package / "definitions.py"]
    reaching_in = [str(p) for p in example if re.search(r"idem_assets\.lib\b", p.read_text())]
    assert reaching_in == []
