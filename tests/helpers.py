"""Helpers every test and benchmark shares: the partitions, a fixed clock, settings, windows."""

import json
import pickle
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import dagster as dg

import idem_assets as ia

DAILY = dg.DailyPartitionsDefinition(start_date="2026-01-01")
#: A fixed "now" for publish(): long after every test window, so run-time checks are stable.
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
TRIPS_METADATA: dict[str, Any] = {"partition_expr": "pickup_at", "primary_key": ["trip_id"]}


def settings(
    mode: str = "overwrite",
    metadata: Mapping[str, Any] | None = None,
    *,
    table: str = "trips",
    partitioned: bool = True,
    partitions_def: dg.PartitionsDefinition | None = None,
) -> ia.WriteSettings:
    """Write settings resolved the way the IO managers resolve them (for ``partitions_def``)."""
    return ia.resolve_settings(
        asset_key=dg.AssetKey([table]),
        metadata=dict(metadata if metadata is not None else TRIPS_METADATA),
        mode=mode,  # type: ignore[arg-type]
        default_schema="main",
        partitioned=partitioned,
        partitions_def=partitions_def,
    )


def window(
    *keys: str, partitions: dg.TimeWindowPartitionsDefinition = DAILY, asset: str = "test"
) -> ia.WriteWindow:
    """The write window of partition ``keys`` (daily from 2026-01-01 unless told)."""
    return ia.window_from_keys(partitions, list(keys), asset)


def range_tags(first: str, last: str) -> dict[str, str]:
    """Run tags that make one run materialize partitions ``first`` to ``last`` (a chunk)."""
    return {
        "dagster/asset_partition_range_start": first,
        "dagster/asset_partition_range_end": last,
    }


#: The repository's root: README.md and docs/ are read from there.
REPO_ROOT = Path(__file__).resolve().parents[1]


def doc_section(heading: str, doc: str) -> str:
    """The text of ``doc`` (a path from the repository root) after the line ``heading``."""
    text = (REPO_ROOT / doc).read_text()
    if f"\n{heading}\n" not in text:
        raise AssertionError(f"{doc} has no heading {heading!r}")
    return text.split(f"\n{heading}\n", 1)[1]


def doc_python(heading: str, doc: str = "docs/tutorial.md") -> str:
    """The first Python block under ``heading`` in ``doc``, exactly as printed."""
    return doc_section(heading, doc).split("```python\n", 1)[1].split("```", 1)[0]


def doc_bash(heading: str, doc: str = "docs/tutorial.md") -> list[str]:
    """The command lines of the first bash block under ``heading`` in ``doc``, as printed."""
    block = doc_section(heading, doc).split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


@dataclass
class Receiver:
    """Every request an HTTP endpoint got; it answers 500 to the next ``fail_next`` POSTs."""

    url: str
    requests: list[dict[str, Any]] = field(default_factory=list)
    #: How many GETs it answered (a GET only reads).
    reads: int = 0
    fail_next: int = 0

    def keys(self) -> list[str]:
        """The Idempotency-Key of every POST, in arrival order."""
        return [r["key"] for r in self.requests]

    def deduplicated(self) -> dict[str, Any]:
        """What a receiver that drops repeated keys keeps: one body per key."""
        return {r["key"]: r["body"] for r in self.requests}


@contextmanager
def http_receiver() -> Iterator[Receiver]:
    """A real HTTP endpoint on 127.0.0.1 that records each POST and answers each GET."""
    state = Receiver(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state.requests.append(
                {
                    "key": self.headers.get("Idempotency-Key"),
                    "supersedes": self.headers.get("Supersedes"),
                    "body": body,
                }
            )
            failing = state.fail_next > 0
            state.fail_next -= failing
            self.send_response(500 if failing else 200)
            self.end_headers()

        def do_GET(self) -> None:
            state.reads += 1
            body = json.dumps({"rate": 1.25}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_port}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def step_failure(result: dg.ExecuteInProcessResult) -> str:
    """The first failed step's error, with its cause, as the run log shows it."""
    failed = [e for e in result.all_events if e.is_step_failure]
    assert failed, "the run failed without a step failure"
    data = failed[0].step_failure_data
    assert data is not None and data.error is not None
    return data.error.to_string()


def run_child(module: str, spec: object) -> dict[str, Any]:
    """Run ``python -m module`` with ``spec`` pickled on its stdin; the JSON of its last line.

    A fresh process for what must be measured alone (a peak RSS), or must not share this one's
    imports and caches.
    """
    found = subprocess.run(
        [sys.executable, "-m", module],
        input=pickle.dumps(spec),
        capture_output=True,
        timeout=600,
        check=True,
    )
    return json.loads(found.stdout.decode().splitlines()[-1])
