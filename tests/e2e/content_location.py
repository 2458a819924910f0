"""The taxi code location, with ``ia.content_changed()`` on every asset downstream of raw_trips.

The real location (``idem_assets.definitions``) declares no automation, so its backfill tests
get no automation runs; this module adds the condition the way a user would, plus a sensor that
evaluates it every few seconds once it is started (as a user turns automation on after the
initial load).
"""

from pathlib import Path

import dagster as dg

import idem_assets as ia

# Imported for its warning filter too, which the load below needs.
import idem_assets.definitions

DOWNSTREAM = ["trips", "daily_zone_revenue", "revenue_running_total"]
SENSOR = "content_changed_sensor"
TICK_SECONDS = 5


def _on_content_change(spec: dg.AssetSpec) -> dg.AssetSpec:
    return spec.replace_attributes(automation_condition=ia.content_changed())


def _location() -> dg.Definitions:
    """The real location, each asset once (the defs folder imports some twice), plus automation."""
    loaded = dg.load_from_defs_folder(
        path_within_project=Path(idem_assets.definitions.__file__).parent
    )
    assets = list({id(a): a for a in loaded.assets or []}.values())
    return dg.Definitions(
        assets=[
            a.map_asset_specs(_on_content_change)
            if isinstance(a, dg.AssetsDefinition) and a.key.to_user_string() in DOWNSTREAM
            else a
            for a in assets
        ],
        asset_checks=loaded.asset_checks,
        jobs=loaded.jobs,
        schedules=loaded.schedules,
        sensors=[
            *(loaded.sensors or []),
            dg.AutomationConditionSensorDefinition(
                SENSOR,
                target=dg.AssetSelection.all(),
                default_status=dg.DefaultSensorStatus.STOPPED,
                minimum_interval_seconds=TICK_SECONDS,
            ),
        ],
        resources=loaded.resources,
    )


# Dagster takes the one Definitions object at module scope as the location.
defs = _location()
