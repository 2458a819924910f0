"""Start the real dagster-daemon and dagster-webserver for end-to-end tests, and talk to them."""

import atexit
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

import yaml
from ports import (
    PortChooser,
    PortTakenError,
    bind_failed,
    free_port,
    held_only_by,
    start_on_a_free_port,
)

# The binaries of the interpreter running the tests: sys.executable is not resolved, so a venv's
# python points at the venv's bin rather than at the base interpreter's.
VENV_BIN = Path(sys.executable).parent
REPO_ROOT = Path(__file__).resolve().parents[2]

# Runs launched by the DefaultRunLauncher are grandchildren of the daemon; this tag joins a run to
# the backfill that created it, whichever daemon or CLI submitted it.
BACKFILL_TAG = "dagster/backfill"

TERMINAL_BACKFILL_STATUSES = frozenset(
    {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}
)
TERMINAL_RUN_STATUSES = frozenset({"SUCCESS", "FAILURE", "CANCELED"})
DEFAULT_REQUIRED_DAEMONS = ("QUEUED_RUN_COORDINATOR", "BACKFILL")

# The backfill daemon sleeps dagster._daemon.controller.DEFAULT_DAEMON_INTERVAL_SECONDS (30 s)
# between ticks and no instance setting or env var changes it in 1.13, so a fast test daemon runs
# the stock CLI entry point after patching that constant; it is read when the loop starts.
_PATCHED_DAEMON_SCRIPT = """\
import sys
import dagster._daemon.controller as controller
controller.DEFAULT_DAEMON_INTERVAL_SECONDS = float(sys.argv.pop(1))
from dagster._daemon.cli import main
sys.exit(main())
"""


def fast_dagster_yaml(*, max_concurrent_runs: int = 3, dequeue_interval_seconds: int = 1) -> str:
    """Return a test dagster.yaml: queued runs, a concurrency cap, fast dequeue, no telemetry."""
    return (
        "run_coordinator:\n"
        "  module: dagster.core.run_coordinator\n"
        "  class: QueuedRunCoordinator\n"
        "  config:\n"
        f"    dequeue_interval_seconds: {dequeue_interval_seconds}\n"
        "concurrency:\n"
        "  runs:\n"
        f"    max_concurrent_runs: {max_concurrent_runs}\n"
        "telemetry:\n"
        "  enabled: false\n"
    )


class GraphQLError(RuntimeError):
    """The webserver answered a GraphQL request with an error."""


class ServicesError(RuntimeError):
    """The daemon or webserver failed to start, or a wait on them timed out."""


@dataclass(frozen=True)
class RunRecord:
    """One run as the webserver reports it; times are epoch seconds."""

    run_id: str
    status: str
    tags: Mapping[str, str]
    creation_time: float
    start_time: float | None
    end_time: float | None

    @property
    def partition(self) -> str | None:
        """The run's partition key, or 'start...end' for a run over a range of partitions."""
        if "dagster/partition" in self.tags:
            return self.tags["dagster/partition"]
        # Asset backfills tag even a one-partition run with a range.
        start = self.tags.get("dagster/asset_partition_range_start")
        end = self.tags.get("dagster/asset_partition_range_end")
        if start is None or end is None:
            return None
        return start if start == end else f"{start}...{end}"


def max_overlap(records: Iterable[RunRecord]) -> int:
    """Return the largest number of runs whose closed [start, end] intervals share a moment.

    Runs that never started are ignored; a run that has not ended counts as still running.
    """
    events: list[tuple[float, int]] = []
    for record in records:
        if record.start_time is None:
            continue
        end = record.end_time if record.end_time is not None else float("inf")
        # Starts sort before ends at the same instant, so intervals that touch count as overlapping.
        events.append((record.start_time, 0))
        events.append((end, 1))
    running = peak = 0
    for _, kind in sorted(events):
        running += 1 if kind == 0 else -1
        peak = max(peak, running)
    return peak


_LAUNCH_BACKFILL = """
mutation LaunchPartitionBackfill($backfillParams: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $backfillParams) {
    __typename
    ... on LaunchBackfillSuccess { backfillId launchedRunIds }
    ... on Error { message }
    ... on PythonError { message stack }
    ... on InvalidStepError { invalidStepKey }
    ... on InvalidOutputError { stepKey invalidOutputName }
    ... on RunConfigValidationInvalid { pipelineName errors { message } }
  }
}
"""

_BACKFILL_STATUS = """
query PartitionBackfill($backfillId: String!) {
  partitionBackfillOrError(backfillId: $backfillId) {
    __typename
    ... on PartitionBackfill { id status numPartitions error { message stack } }
    ... on Error { message }
    ... on PythonError { message stack }
  }
}
"""

_RUNS = """
query Runs($filter: RunsFilter!) {
  runsOrError(filter: $filter) {
    __typename
    ... on Runs {
      results {
        runId status creationTime startTime endTime updateTime
        tags { key value }
      }
    }
    ... on Error { message }
    ... on PythonError { message stack }
  }
}
"""

_WORKSPACE = """
query Workspace {
  workspaceOrError {
    __typename
    ... on Workspace {
      locationEntries {
        name
        loadStatus
        locationOrLoadError {
          __typename
          ... on RepositoryLocation { name repositories { name } }
          ... on PythonError { message stack }
        }
      }
    }
    ... on PythonError { message stack }
  }
}
"""

# The instance's description; its local artifact storage is DAGSTER_HOME unless configured.
_INSTANCE_INFO = """
query InstanceInfo {
  instance { info }
}
"""

_DAEMON_HEALTH = """
query DaemonHealth {
  instance {
    daemonHealth {
      allDaemonStatuses { daemonType required healthy lastHeartbeatErrors { message } }
    }
  }
}
"""


def _describe_error(payload: Mapping[str, Any]) -> str:
    """Render a GraphQL error union member as one readable string."""
    return f"{payload.get('__typename')}: {json.dumps(payload, indent=2)}"


class DagsterGraphQLClient:
    """A minimal client for the webserver's /graphql endpoint, using only urllib."""

    def __init__(
        self,
        url: str,
        *,
        request_timeout_s: float = 30.0,
        diagnostics: Callable[[], str] | None = None,
    ) -> None:
        self.url = url
        self.request_timeout_s = request_timeout_s
        # Appended to timeout errors so a hung backfill shows what the daemon logged.
        self._diagnostics = diagnostics

    def execute(self, query: str, variables: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """POST a query and return its `data`; raise GraphQLError on transport or GraphQL errors."""
        body = json.dumps({"query": query, "variables": dict(variables or {})}).encode()
        request = urllib.request.Request(
            self.url, data=body, headers={"Content-Type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=self.request_timeout_s) as response:
                result = json.loads(response.read())
        except urllib.error.HTTPError as error:
            # The webserver reports query validation errors with HTTP 400 and a JSON body.
            raise GraphQLError(
                f"HTTP {error.code} from {self.url}: {error.read().decode()}"
            ) from error
        if result.get("errors"):
            raise GraphQLError(json.dumps(result["errors"], indent=2))
        return result["data"]

    def launch_partition_backfill(
        self,
        asset_keys: Sequence[str] | None,
        partition_names: Sequence[str],
        *,
        job_name: str | None = None,
        location: str,
        repository: str = "__repository__",
        tags: Mapping[str, str] | None = None,
    ) -> str:
        """Launch a backfill exactly as the UI does and return its id.

        With `job_name`, the backfill targets the job's partition set (optionally narrowed to
        `asset_keys`); without it, it is a pure asset backfill of `asset_keys`. Asset keys are
        slash-separated paths, e.g. "raw/orders".
        """
        params: dict[str, Any] = {"partitionNames": list(partition_names)}
        if asset_keys:
            params["assetSelection"] = [{"path": key.split("/")} for key in asset_keys]
        if job_name is not None:
            params["selector"] = {
                # Dagster names a partitioned job's partition set after the job.
                "partitionSetName": f"{job_name}_partition_set",
                "repositorySelector": {
                    "repositoryName": repository,
                    "repositoryLocationName": location,
                },
            }
        elif not asset_keys:
            raise ValueError("Give asset_keys for an asset backfill or job_name for a job backfill")
        if tags:
            params["tags"] = [{"key": key, "value": value} for key, value in tags.items()]
        result = self.execute(_LAUNCH_BACKFILL, {"backfillParams": params})
        payload = result["launchPartitionBackfill"]
        if payload["__typename"] != "LaunchBackfillSuccess":
            raise GraphQLError(f"launchPartitionBackfill failed: {_describe_error(payload)}")
        return payload["backfillId"]

    def backfill_status(self, backfill_id: str) -> dict[str, Any]:
        """Return the backfill's id, status, numPartitions and error."""
        result = self.execute(_BACKFILL_STATUS, {"backfillId": backfill_id})
        payload = result["partitionBackfillOrError"]
        if payload["__typename"] != "PartitionBackfill":
            raise GraphQLError(f"partitionBackfillOrError failed: {_describe_error(payload)}")
        return payload

    def runs_for_backfill(self, backfill_id: str) -> list[RunRecord]:
        """Return the runs tagged with this backfill, oldest first."""
        variables = {"filter": {"tags": [{"key": BACKFILL_TAG, "value": backfill_id}]}}
        payload = self.execute(_RUNS, variables)["runsOrError"]
        if payload["__typename"] != "Runs":
            raise GraphQLError(f"runsOrError failed: {_describe_error(payload)}")
        records = [
            RunRecord(
                run_id=run["runId"],
                status=run["status"],
                tags={tag["key"]: tag["value"] for tag in run["tags"]},
                creation_time=run["creationTime"],
                # startTime/endTime come from the run record's RUN_START/RUN_SUCCESS timestamps,
                # not from when the run was queued.
                start_time=run["startTime"],
                end_time=run["endTime"],
            )
            for run in payload["results"]
        ]
        return sorted(records, key=lambda record: record.creation_time)

    def wait_for_backfill(
        self, backfill_id: str, timeout_s: float, *, poll_interval_s: float = 0.5
    ) -> dict[str, Any]:
        """Wait until the backfill and all of its runs are finished; return status and run ids.

        Waiting for the runs too matters for `dagster job backfill`: the CLI marks its backfill
        COMPLETED as soon as it has queued the runs.
        """
        deadline = time.monotonic() + timeout_s
        status: dict[str, Any] = {}
        runs: list[RunRecord] = []
        while time.monotonic() < deadline:
            status = self.backfill_status(backfill_id)
            if status["status"] in TERMINAL_BACKFILL_STATUSES:
                runs = self.runs_for_backfill(backfill_id)
                if all(run.status in TERMINAL_RUN_STATUSES for run in runs):
                    return {
                        "id": backfill_id,
                        "status": status["status"],
                        "error": status.get("error"),
                        "run_ids": [run.run_id for run in runs],
                    }
            time.sleep(poll_interval_s)
        runs = self.runs_for_backfill(backfill_id)
        summary = ", ".join(f"{run.run_id[:8]}={run.status}" for run in runs) or "no runs"
        message = (
            f"Backfill {backfill_id} not finished after {timeout_s:.0f}s: "
            f"status={status.get('status')}, runs: {summary}"
        )
        if self._diagnostics is not None:
            message += "\n" + self._diagnostics()
        raise ServicesError(message)

    def location_entries(self) -> list[dict[str, Any]]:
        """Return the workspace's code location entries."""
        payload = self.execute(_WORKSPACE)["workspaceOrError"]
        if payload["__typename"] != "Workspace":
            raise GraphQLError(f"workspaceOrError failed: {_describe_error(payload)}")
        return payload["locationEntries"]

    def instance_home(self) -> str | None:
        """Return the base directory of the instance the webserver serves, from `instance.info`."""
        info = self.execute(_INSTANCE_INFO)["instance"]["info"]
        storage = yaml.safe_load(info or "{}").get("local_artifact_storage")
        return storage.get("config", {}).get("base_dir") if isinstance(storage, dict) else None

    def daemon_statuses(self) -> dict[str, dict[str, Any]]:
        """Return each daemon's status keyed by daemon type."""
        data = self.execute(_DAEMON_HEALTH)
        statuses = data["instance"]["daemonHealth"]["allDaemonStatuses"]
        return {status["daemonType"]: status for status in statuses}


@dataclass
class _Service:
    """One started process group and its log file."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]
    # Where this process's output starts in a log that earlier attempts also wrote.
    log_offset: int = 0

    def output(self) -> str:
        """Return what this process has written to its log."""
        with self.log_path.open("rb") as log:
            log.seek(self.log_offset)
            return log.read().decode(errors="replace")


@dataclass(frozen=True)
class _ProcInfo:
    pid: int
    pgid: int
    state: str


def _read_proc(pid: int) -> _ProcInfo | None:
    """Read a process's state and process group from /proc, or None if it has gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name is parenthesised and may contain spaces, so split after its closing paren.
    fields = stat[stat.rfind(")") + 2 :].split()
    return _ProcInfo(pid=pid, pgid=int(fields[2]), state=fields[0])


def _all_pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _tail(path: Path, lines: int = 60) -> str:
    """Return the last lines of a log file, or a note that it is missing."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class DagsterServices:
    """dagster-daemon and dagster-webserver on a private DAGSTER_HOME, stopped without leftovers.

    Use as a context manager, or call `start()`/`stop()` from a pytest fixture.
    """

    dagster_home: Path
    dagster_yaml: str
    # The code location: a workspace file, as `make dev` and the README load it (the location's
    # name is then the user's), or a bare module (named after the module), for toy locations.
    workspace: Path | None = None
    module: str | None = None
    working_directory: Path = REPO_ROOT
    env: Mapping[str, str] = field(default_factory=dict)
    # None keeps the stock 30 s backfill tick and the stock `dagster-daemon` binary.
    backfill_interval_seconds: float | None = None
    required_daemons: Sequence[str] = DEFAULT_REQUIRED_DAEMONS
    startup_timeout_s: float = 120.0
    shutdown_grace_s: float = 10.0
    # The production shape: a `dagster code-server start` serves `module`, and the daemon and
    # webserver load `workspace` over gRPC from $DAGSTER_GRPC_HOST:$DAGSTER_GRPC_PORT, which
    # process_env() sets to the code server's port (deploy/workspace.yaml reads them).
    code_server: bool = False
    # Picks each port to try; a port another process takes first is replaced by the next pick.
    choose_port: PortChooser = free_port
    port: int = field(default=0, init=False)
    code_server_port: int | None = field(default=None, init=False)
    _services: list[_Service] = field(default_factory=list, init=False, repr=False)
    _token: str = field(default_factory=lambda: uuid.uuid4().hex, init=False, repr=False)
    # Kept after stop() so leftover_processes() can still prove the groups are empty.
    _pgids: set[int] = field(default_factory=set, init=False, repr=False)
    _location_name: str | None = field(default=None, init=False, repr=False)

    @property
    def url(self) -> str:
        """The webserver's base URL."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def client(self) -> DagsterGraphQLClient:
        """A GraphQL client for the webserver whose timeouts report the service logs."""
        return DagsterGraphQLClient(f"{self.url}/graphql", diagnostics=self.log_tails)

    @property
    def location_name(self) -> str:
        """The name the workspace gave the code location."""
        if self._location_name is None:
            raise ServicesError("The services have not started")
        return self._location_name

    @property
    def daemon_log(self) -> Path:
        """Where the daemon's stdout and stderr go."""
        return self.dagster_home / "daemon.log"

    @property
    def webserver_log(self) -> Path:
        """Where the webserver's stdout and stderr go."""
        return self.dagster_home / "webserver.log"

    @property
    def code_server_log(self) -> Path:
        """Where the gRPC code server's stdout and stderr go."""
        return self.dagster_home / "code_server.log"

    def process_env(self) -> dict[str, str]:
        """Return the environment the services run with, for CLI commands that must match it."""
        env = dict(os.environ)
        env.update(self.env)
        env["DAGSTER_HOME"] = str(self.dagster_home)
        env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
        # As in an activated venv, so `dg` runs the project's environment without a warning.
        env["VIRTUAL_ENV"] = str(VENV_BIN.parent)
        # Every descendant inherits this marker, which finds run workers that left our groups.
        env["IDEM_E2E_SERVICES_TOKEN"] = self._token
        env["PYTHONUNBUFFERED"] = "1"
        if self.code_server_port is not None:
            env["DAGSTER_GRPC_HOST"] = "127.0.0.1"
            env["DAGSTER_GRPC_PORT"] = str(self.code_server_port)
        return env

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start both services; wait until the location has loaded and the daemons are healthy."""
        self.dagster_home.mkdir(parents=True, exist_ok=True)
        (self.dagster_home / "dagster.yaml").write_text(self.dagster_yaml)
        if self.code_server:
            if self.workspace is None or self.module is None:
                raise ValueError("A code server needs module= to serve and workspace= to load it")
        elif (self.workspace is None) == (self.module is None):
            raise ValueError("Give DagsterServices exactly one of workspace= and module=")
        if self.workspace is not None:
            target = ["-w", str(self.workspace)]
        else:
            target = ["-m", str(self.module), "-d", str(self.working_directory)]
        if self.backfill_interval_seconds is None:
            daemon_cmd = [str(VENV_BIN / "dagster-daemon"), "run", *target]
        else:
            daemon_cmd = [
                sys.executable,
                "-c",
                _PATCHED_DAEMON_SCRIPT,
                str(self.backfill_interval_seconds),
                "run",
                *target,
            ]
        deadline = time.monotonic() + self.startup_timeout_s
        self._initialize_storage(deadline)
        # Registered before anything starts so an interpreter exit mid-startup still cleans up.
        atexit.register(self.stop)
        try:
            if self.code_server:
                module_target = ["-m", str(self.module), "-d", str(self.working_directory)]
                start_on_a_free_port(
                    lambda port: self._start_code_server(port, module_target, deadline),
                    self.choose_port,
                )
            self._spawn("daemon", daemon_cmd, self.daemon_log)
            start_on_a_free_port(
                lambda port: self._start_webserver(port, target, deadline), self.choose_port
            )
        except BaseException:
            # KeyboardInterrupt included: __exit__ never runs when __enter__ raises.
            self.stop()
            raise

    def stop(self) -> None:
        """Stop both process groups and every process that carries this harness's environment."""
        atexit.unregister(self.stop)
        if not self._services and not self.leftover_processes():
            return
        try:
            self._signal_all(signal.SIGTERM)
            self._wait_for_exit(self.shutdown_grace_s)
        finally:
            # Also reached on a second Ctrl-C during the grace period: never leave processes behind.
            self._signal_all(signal.SIGKILL)
            self._wait_for_exit(10.0)
            for service in self._services:
                service.process.wait(timeout=5)
                service.log_file.close()
            self._services.clear()

    def leftover_processes(self) -> list[int]:
        """Return live pids in our process groups or whose environment or cwd points at us."""
        pgids = self._pgids
        home = str(self.dagster_home)
        markers = (
            f"IDEM_E2E_SERVICES_TOKEN={self._token}".encode(),
            f"DAGSTER_HOME={home}".encode(),
        )
        found = []
        for pid in _all_pids():
            if pid == os.getpid():
                continue
            info = _read_proc(pid)
            # Zombies have exited; they linger until a parent (maybe a non-reaping PID 1) waits.
            if info is None or info.state == "Z":
                continue
            if info.pgid in pgids or _proc_matches(pid, markers, home):
                found.append(pid)
        return found

    def wait_for_backfill_runs(
        self, backfill_id: str, count: int, timeout_s: float = 600
    ) -> list[RunRecord]:
        """Wait until ``count`` runs of the backfill exist and all have finished; return them.

        Unlike the client's ``wait_for_backfill`` this does not trust the backfill's status: a
        `dagster job backfill` reads COMPLETED as soon as its runs are queued, even if they die.
        """
        deadline = time.monotonic() + timeout_s
        records: list[RunRecord] = []
        while time.monotonic() < deadline:
            records = self.client.runs_for_backfill(backfill_id)
            if len(records) >= count and all(r.status in TERMINAL_RUN_STATUSES for r in records):
                return records
            time.sleep(0.5)
        summary = ", ".join(f"{r.partition}={r.status}" for r in records) or "no runs"
        raise ServicesError(f"Runs of {backfill_id} not finished: {summary}\n{self.log_tails()}")

    def log_tails(self) -> str:
        """Return the tail of every service log, for error messages."""
        logs = [self.daemon_log, self.webserver_log]
        if self.code_server:
            logs.append(self.code_server_log)
        return "\n".join(f"--- {log} ---\n{_tail(log)}" for log in logs)

    def run_cli(
        self, args: Sequence[str], *, timeout_s: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """Run `dagster <args>` against this instance in its own process group; raise on failure."""
        process = subprocess.Popen(
            [str(VENV_BIN / "dagster"), *args],
            cwd=self.working_directory,
            env=self.process_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
        except BaseException:
            # The CLI starts its own code server; take the whole group down with it.
            _killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise
        result = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
        if result.returncode != 0:
            raise ServicesError(
                f"`dagster {' '.join(args)}` exited {result.returncode}\n"
                f"stdout:\n{stdout}\nstderr:\n{stderr}"
            )
        return result

    def run_shell(
        self, command: str, *, timeout_s: float = 300.0
    ) -> subprocess.CompletedProcess[str]:
        """Run a command line exactly as a user types it (bash, in the working directory)."""
        process = subprocess.Popen(
            ["bash", "-c", command],
            cwd=self.working_directory,
            env=self.process_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
        except BaseException:
            _killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise
        return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)

    def _initialize_storage(self, deadline: float) -> None:
        """Create the storage schema before two processes race to create it.

        On a fresh SQLite DAGSTER_HOME the daemon's and webserver's code servers both stamp
        `alembic_version`, and the loser fails to load the location with "Version table
        'alembic_version' has more than one head present".
        """
        log_path = self.dagster_home / "instance_migrate.log"
        try:
            with log_path.open("wb") as log_file:
                returncode = subprocess.run(
                    [str(VENV_BIN / "dagster"), "instance", "migrate"],
                    cwd=self.working_directory,
                    env=self.process_env(),
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    timeout=max(deadline - time.monotonic(), 0.1),
                    check=False,
                ).returncode
        except subprocess.TimeoutExpired as error:
            raise ServicesError(
                f"Timed out after {self.startup_timeout_s:.0f}s initializing storage\n"
                f"{_tail(log_path)}"
            ) from error
        if returncode != 0:
            raise ServicesError(
                f"`dagster instance migrate` exited {returncode}\n{_tail(log_path)}"
            )

    def _start_code_server(self, port: int, module_target: Sequence[str], deadline: float) -> None:
        """Start the gRPC code server on ``port`` and wait until it, and only it, answers there.

        The webserver records a location it cannot reach at startup as a load error, so the
        server must answer before the webserver and daemon start.
        """
        self.code_server_port = port
        command = [str(VENV_BIN / "dagster"), "code-server", "start", "-h", "127.0.0.1", "-p"]
        service = self._spawn(
            "code-server", [*command, str(port), *module_target], self.code_server_log
        )
        health = [
            str(VENV_BIN / "dagster"),
            "api",
            "grpc-health-check",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
        ]
        while time.monotonic() < deadline:
            self._raise_if_exited(service)
            check = subprocess.run(
                health, env=self.process_env(), capture_output=True, timeout=30, check=False
            )
            if check.returncode == 0:
                if held_only_by(port, self._group_pids(service)):
                    return
                # gRPC sets SO_REUSEPORT: another gRPC server on this port would share its calls.
                self._discard(service)
                raise PortTakenError(f"Another process also listens on code server port {port}")
            time.sleep(0.5)
        raise ServicesError(f"The code server never became healthy\n{self.log_tails()}")

    def _start_webserver(self, port: int, target: Sequence[str], deadline: float) -> None:
        """Start the webserver on ``port``; wait until it answers as this instance and is ready."""
        self.port = port
        command = [str(VENV_BIN / "dagster-webserver"), "--host", "127.0.0.1", "--port"]
        self._spawn("webserver", [*command, str(port), *target], self.webserver_log)
        self._wait_until_ready(deadline)

    def _spawn(self, name: str, command: list[str], log_path: Path) -> _Service:
        log_file = log_path.open("ab")
        log_offset = log_file.tell()
        process = subprocess.Popen(
            command,
            cwd=self.working_directory,
            env=self.process_env(),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            # A session of its own makes the process a group leader (pgid == pid), so killpg
            # reaches its code server and run workers, and a terminal's Ctrl-C does not.
            start_new_session=True,
        )
        service = _Service(name, process, log_path, log_file, log_offset)
        self._services.append(service)
        self._pgids.add(process.pid)
        return service

    def _raise_if_exited(self, service: _Service) -> None:
        """Raise PortTakenError if the service exited failing to bind, ServicesError if else."""
        if service.process.poll() is None:
            return
        if bind_failed(service.output()):
            self._discard(service)
            raise PortTakenError(f"The {service.name} lost its port to another process")
        raise ServicesError(
            f"{service.name} exited with {service.process.returncode} during startup\n"
            f"{self.log_tails()}"
        )

    def _discard(self, service: _Service) -> None:
        """Stop a service that lost its port and forget it; its group stays in leftover checks."""
        _killpg(service.process.pid, signal.SIGKILL)
        service.process.wait(timeout=10)
        service.log_file.close()
        self._services.remove(service)

    def _group_pids(self, service: _Service) -> list[int]:
        """The live processes of the service's process group."""
        pgid = service.process.pid
        return [pid for pid in _all_pids() if (info := _read_proc(pid)) and info.pgid == pgid]

    def _wait_until_ready(self, deadline: float) -> None:
        client = DagsterGraphQLClient(f"{self.url}/graphql", request_timeout_s=5.0)
        waiting_for = "the webserver to answer /server_info"
        while time.monotonic() < deadline:
            for service in list(self._services):
                self._raise_if_exited(service)
            try:
                waiting_for = "the webserver to answer /server_info"
                with urllib.request.urlopen(f"{self.url}/server_info", timeout=5.0) as response:
                    response.read()
                # Until ours binds, or fails to, the port may be answered by another process's
                # webserver that took it first, whose location and daemons look just as ready.
                home = client.instance_home()
                if home is None or Path(home).resolve() != self.dagster_home.resolve():
                    waiting_for = f"the webserver of {self.dagster_home} (port answered by {home})"
                    time.sleep(0.5)
                    continue
                waiting_for = "the code location to load"
                if not self._location_loaded(client):
                    time.sleep(0.5)
                    continue
                waiting_for = f"daemons {', '.join(self.required_daemons)} to be healthy"
                statuses = client.daemon_statuses()
                if all(statuses.get(name, {}).get("healthy") for name in self.required_daemons):
                    return
            except (OSError, GraphQLError):
                # Connection refused or reset while the webserver is still booting.
                pass
            time.sleep(0.5)
        raise ServicesError(
            f"Timed out after {self.startup_timeout_s:.0f}s waiting for {waiting_for}\n"
            f"{self.log_tails()}"
        )

    def _location_loaded(self, client: DagsterGraphQLClient) -> bool:
        entries = client.location_entries()
        for entry in entries:
            if entry["loadStatus"] != "LOADED":
                return False
            location = entry["locationOrLoadError"]
            if location is None or location["__typename"] != "RepositoryLocation":
                # A load error will not fix itself; fail now rather than at the timeout.
                raise ServicesError(
                    f"Code location {entry['name']} failed to load: {json.dumps(location)}\n"
                    f"{self.log_tails()}"
                )
        if len(entries) != 1:
            return False
        self._location_name = entries[0]["name"]
        return True

    def _signal_all(self, sig: signal.Signals) -> None:
        for service in self._services:
            _killpg(service.process.pid, sig)
        for pid in self.leftover_processes():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def _wait_for_exit(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for service in self._services:
                # Reap the group leaders so they do not linger as zombies.
                service.process.poll()
            if not self.leftover_processes():
                return
            time.sleep(0.1)


def _proc_matches(pid: int, markers: Sequence[bytes], home: str) -> bool:
    """Whether the process's environment holds one of the markers or its cwd is under home."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        # Gone, or another user's process we may not inspect.
        return False
    return any(marker in environ for marker in markers) or cwd == home or cwd.startswith(home + "/")


def _killpg(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
