"""A child process that exports one day's revenue report and is SIGKILLed at an outbox stage.

``python -m tests.defs.report_worker DAY STAGE`` with IDEM_DUCKDB_PATH and IDEM_LANDING_DIR set.
"""

import os
import signal
import sys
from collections.abc import Sequence

import dagster as dg

import idem_assets.definitions
from idem_assets.lib.outbox.outbox import OUTBOX_STAGE_HOOK


def main(argv: Sequence[str]) -> int:
    """Run the revenue_report job for DAY, dying when the delivery reaches STAGE."""
    day, stage = argv

    def die(reached: str) -> None:
        if reached == stage:
            os.kill(os.getpid(), signal.SIGKILL)

    OUTBOX_STAGE_HOOK.set(die)
    defs = idem_assets.definitions.defs.load_fn()
    with dg.instance_for_test() as instance:
        result = defs.resolve_job_def("revenue_report").execute_in_process(
            instance=instance, partition_key=day, raise_on_error=False
        )
    return 0 if result.success else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
