"""Resources: where the warehouse and the landing zone live (environment variables override)."""

from pathlib import Path

import dagster as dg
from pydantic import Field

from idem_assets.defs.warehouse import engine
from idem_assets.landing import default_landing_dir


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
    """IO managers for both write modes on the chosen warehouse, and the landing zone."""
    overwrite, merge = engine().io_managers()
    return dg.Definitions(
        resources={
            "overwrite_io_manager": overwrite,
            "merge_io_manager": merge,
            "landing": LandingZone(root=str(default_landing_dir())),
        }
    )
