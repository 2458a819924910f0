"""Resources: where the warehouse and the landing zone live (environment variables override)."""

import os
from pathlib import Path

import dagster as dg
from pydantic import Field

from idem_assets import DuckDBMergeIOManager, DuckDBOverwriteIOManager
from idem_assets.landing import default_landing_dir

REPO_ROOT = Path(__file__).resolve().parents[2]


def warehouse_path() -> str:
    """The DuckDB file: ``$IDEM_DUCKDB_PATH``, else ``.data/warehouse.duckdb`` in the checkout."""
    return os.environ.get("IDEM_DUCKDB_PATH") or str(REPO_ROOT / ".data" / "warehouse.duckdb")


class LandingZone(dg.ConfigurableResource):
    """The folder the source system drops one CSV and one manifest per day into."""

    root: str = Field(
        description="Landing folder; $IDEM_LANDING_DIR, else .data/landing in the checkout.",
    )

    @property
    def path(self) -> Path:
        """The landing folder as a Path."""
        return Path(self.root)


@dg.definitions
def resources() -> dg.Definitions:
    """IO managers for both write modes on one DuckDB file, and the landing zone."""
    database = warehouse_path()
    Path(database).parent.mkdir(parents=True, exist_ok=True)
    return dg.Definitions(
        resources={
            "overwrite_io_manager": DuckDBOverwriteIOManager(database=database),
            "merge_io_manager": DuckDBMergeIOManager(database=database),
            "landing": LandingZone(root=str(default_landing_dir())),
        }
    )
