"""A notification asset sent through the outbox, and a child process that dies mid-delivery.

``python -m tests.lib.outbox_worker LEDGER URL VERSION DAY [STAGE]`` materialises ``notify`` for
DAY; with STAGE, the process SIGKILLs itself when the delivery reaches that stage.
"""

import json
import os
import signal
import sys
import urllib.request
from collections.abc import Sequence

import dagster as dg
import pyarrow as pa
from pydantic import Field

import idem_assets as ia
from idem_assets.lib.outbox.outbox import OUTBOX_STAGE_HOOK
from tests.helpers import DAILY

ACTION = "post_summary"


class Webhook(dg.ConfigurableResource):
    """A receiver on 127.0.0.1 that the test starts."""

    url: str = Field(description="Where to POST.")

    def post(self, delivery: ia.Delivery, body: dict) -> None:
        """POST ``body`` with the delivery's idempotency key in a header."""
        headers = {"Content-Type": "application/json", "Idempotency-Key": delivery.key}
        if delivery.supersedes:
            headers["Supersedes"] = delivery.supersedes
        request = urllib.request.Request(
            self.url, data=json.dumps(body).encode(), headers=headers, method="POST"
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()


class Source(dg.ConfigurableResource):
    """What the day's numbers are; a new version stands for a corrected input."""

    version: int = Field(default=1, description="Changes the day's totals.")


def summary(day: str, version: int) -> pa.Table:
    """The day's summary rows."""
    return pa.table({"day": [day, day], "metric": ["trips", "revenue"], "value": [100, version]})


@dg.asset(partitions_def=DAILY)
def notify(
    context: dg.AssetExecutionContext, outbox: ia.Outbox, webhook: Webhook, source: Source
) -> dg.MaterializeResult:
    """Post each day's summary once per content."""
    outcomes = []
    for day in context.partition_keys:
        table = summary(day, source.version)
        result = outbox.deliver(
            context,
            ACTION,
            table,
            lambda d, table=table: webhook.post(d, {"rows": table.to_pylist()}),
            partition=day,
        )
        outcomes.append(result.outcome)
    return dg.MaterializeResult(metadata={"outcomes": ", ".join(outcomes)})


def resources(ledger: str, url: str, version: int = 1) -> dict:
    """The outbox, the receiver and the source version."""
    return {
        "outbox": ia.Outbox(ledger=ledger),
        "webhook": Webhook(url=url),
        "source": Source(version=version),
    }


def main(argv: Sequence[str]) -> int:
    """Materialise one day, dying at STAGE if given."""
    ledger, url, version, day, *stage = argv
    if stage:

        def die(reached: str) -> None:
            if reached == stage[0]:
                os.kill(os.getpid(), signal.SIGKILL)

        OUTBOX_STAGE_HOOK.set(die)
    result = dg.materialize(
        [notify], resources=resources(ledger, url, int(version)), partition_key=day
    )
    return 0 if result.success else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
