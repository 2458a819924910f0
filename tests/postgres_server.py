"""A throwaway PostgreSQL cluster on 127.0.0.1 for tests and tools, from Debian's binaries.

`initdb` and `postgres` refuse to run as root, so under root every server process runs as the
unprivileged `postgres` user that Debian's package creates. The cluster lives in a fresh temp
dir, listens on a free loopback port only (no Unix socket outside the temp dir), and requires a
password generated per cluster (scram-sha-256), so nothing else on the machine can reach it.

    with PostgresServer.start() as server, connect(**server.connect_kwargs()) as conn:
        ...
"""

import atexit
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import psycopg2
import psycopg2.extensions
from ports import PortChooser, PortTakenError, bind_failed, free_port, start_on_a_free_port

# Debian installs each major version side by side; the newest wins.
DEBIAN_BIN_GLOB = "/usr/lib/postgresql/*/bin"
# Names a directory holding initdb, pg_ctl and postgres, to use instead of Debian's.
BIN_ENV = "IDEM_PG_BIN"
SERVER_USER = "postgres"
SUPERUSER = "idem"
DEFAULT_DB = "postgres"


class PostgresUnavailableError(RuntimeError):
    """PostgreSQL's server binaries are not installed, or the cluster failed to start."""


@contextmanager
def connect(**kwargs: Any) -> Iterator[psycopg2.extensions.connection]:
    """A psycopg2 connection that commits on success, rolls back on error, and always closes.

    psycopg2's own `with connection` ends the transaction but leaves the connection open.
    """
    conn = psycopg2.connect(**kwargs)
    try:
        with conn:
            yield conn
    finally:
        conn.close()


def find_bin_dir() -> Path:
    """Return the directory of initdb and pg_ctl: $IDEM_PG_BIN, else Debian's newest version."""
    override = os.environ.get(BIN_ENV)
    candidates = [Path(override)] if override else _debian_bin_dirs()
    for candidate in candidates:
        if all(os.access(candidate / name, os.X_OK) for name in ("initdb", "pg_ctl", "postgres")):
            return candidate
    raise PostgresUnavailableError(
        f"No PostgreSQL server binaries in {override or DEBIAN_BIN_GLOB}: run "
        "`make postgres-deps` (or `sudo apt-get install -y postgresql`)"
    )


def _debian_bin_dirs() -> list[Path]:
    """Debian's PostgreSQL bin dirs, newest major version first."""
    dirs = Path("/").glob(DEBIAN_BIN_GLOB.lstrip("/"))

    def major(path: Path) -> int:
        version = path.parent.name
        return int(version) if version.isdigit() else -1

    return sorted(dirs, key=major, reverse=True)


def process_alive(pid: int) -> bool:
    """Whether the process exists and has not exited (a zombie has, whoever reaps it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] != "Z"


def _wait_for_exit(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while process_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _kill(pid: int) -> None:
    """SIGKILL a postmaster that outlived pg_ctl stop; its children exit with it."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@dataclass(frozen=True)
class _RunAs:
    """The account the server processes run as: the `postgres` user when we are root."""

    uid: int | None
    gid: int | None

    @classmethod
    def for_current_user(cls) -> Self:
        if os.geteuid() != 0:
            return cls(None, None)
        try:
            entry = pwd.getpwnam(SERVER_USER)
        except KeyError as error:
            raise PostgresUnavailableError(
                f"Running as root, and there is no '{SERVER_USER}' user to run initdb as "
                "(Debian's postgresql package creates it): install the package, or run as "
                "another user."
            ) from error
        return cls(entry.pw_uid, entry.pw_gid)

    def popen_kwargs(self) -> dict[str, Any]:
        """Arguments that make subprocess drop root, including root's supplementary groups."""
        if self.uid is None:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}

    def own(self, path: Path) -> None:
        if self.uid is not None and self.gid is not None:
            os.chown(path, self.uid, self.gid)


@dataclass
class PostgresServer:
    """One running throwaway cluster; `stop()` (or leaving the `with`) removes every trace."""

    bin_dir: Path
    root: Path
    port: int
    # Kept out of repr, which pytest prints with every failing test's fixtures.
    password: str = field(repr=False)
    user: str = SUPERUSER
    host: str = "127.0.0.1"
    dbname: str = DEFAULT_DB

    @classmethod
    def start(
        cls,
        bin_dir: Path | None = None,
        *,
        timeout_s: float = 60.0,
        choose_port: PortChooser = free_port,
    ) -> Self:
        """Create a cluster in a new temp dir and start it on a free loopback port.

        A port another process binds first is replaced by the next ``choose_port()``.
        """
        bin_dir = bin_dir or find_bin_dir()
        run_as = _RunAs.for_current_user()
        # Not under pytest's basetemp: that is 0700 root, which the postgres user cannot enter.
        root = Path(tempfile.mkdtemp(prefix="idem-pg-"))
        run_as.own(root)
        server = cls(bin_dir=bin_dir, root=root, port=0, password=secrets.token_urlsafe(24))
        # The postmaster has a session of its own, so Ctrl-C never reaches it: stop it on exit.
        atexit.register(server.stop)
        try:
            server._initdb(run_as, timeout_s)
            start_on_a_free_port(
                lambda port: server._start_on(port, run_as, timeout_s), choose_port
            )
            server._check_answers_as_itself()
        except BaseException:
            server.stop()
            raise
        return server

    @property
    def data_dir(self) -> Path:
        """The cluster's data directory (PGDATA)."""
        return self.root / "data"

    @property
    def log_path(self) -> Path:
        """The server log, for error messages."""
        return self.root / "server.log"

    def connect_kwargs(self, dbname: str | None = None) -> dict[str, Any]:
        """Keyword arguments for psycopg2.connect / psycopg.connect."""
        return {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "password": self.password,
            "dbname": dbname or self.dbname,
        }

    def url(self, dbname: str | None = None, scheme: str = "postgresql+psycopg2") -> str:
        """A SQLAlchemy URL; the scheme names the driver (SQLAlchemy 2.1 maps bare postgresql
        to psycopg 3).
        """
        return (
            f"{scheme}://{self.user}:{self.password}@{self.host}:{self.port}/"
            f"{dbname or self.dbname}"
        )

    def psql(self, sql: str, dbname: str | None = None) -> str:
        """Run one SQL string through psql and return its unaligned, tuples-only output."""
        result = subprocess.run(
            [
                str(self.bin_dir / "psql"),
                "-X",
                "-v",
                "ON_ERROR_STOP=1",
                "-At",
                "-h",
                self.host,
                "-p",
                str(self.port),
                "-U",
                self.user,
                "-d",
                dbname or self.dbname,
                "-c",
                sql,
            ],
            env={**os.environ, "PGPASSWORD": self.password},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"psql exited {result.returncode}: {result.stderr}")
        return result.stdout

    def create_database(self, name: str) -> None:
        """Create an empty database owned by the superuser."""
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
            raise ValueError(f"database name {name!r} must match [a-z_][a-z0-9_]*")
        self.psql(f'CREATE DATABASE "{name}"')

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop the server (fast shutdown, then SIGKILL) and delete its temp dir."""
        atexit.unregister(self.stop)
        try:
            pid = self.postmaster_pid()
            if pid is not None:
                subprocess.run(
                    [str(self.bin_dir / "pg_ctl"), "stop", "-D", str(self.data_dir), "-m", "fast"],
                    capture_output=True,
                    timeout=30,
                    check=False,
                    **_RunAs.for_current_user().popen_kwargs(),
                )
                # pg_ctl returns once the pid file is gone, a moment before the process is.
                if not _wait_for_exit(pid, 10.0):
                    _kill(pid)
                    _wait_for_exit(pid, 10.0)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def postmaster_pid(self) -> int | None:
        """The running postmaster's pid, from its pid file."""
        try:
            return int((self.data_dir / "postmaster.pid").read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return None

    def _initdb(self, run_as: _RunAs, timeout_s: float) -> None:
        pwfile = self.root / "pwfile"
        pwfile.write_text(self.password + "\n")
        pwfile.chmod(0o600)
        run_as.own(pwfile)
        try:
            self._run(
                run_as,
                [
                    "initdb",
                    "-D",
                    str(self.data_dir),
                    "-U",
                    self.user,
                    f"--pwfile={pwfile}",
                    # Every connection needs the password, over TCP and the private socket.
                    "--auth=scram-sha-256",
                    "--encoding=UTF8",
                    "--locale=C",
                    "--no-sync",
                ],
                timeout_s,
            )
        finally:
            pwfile.unlink(missing_ok=True)

    def _start_on(self, port: int, run_as: _RunAs, timeout_s: float) -> None:
        """Start the server on ``port``; raise PortTakenError if another process holds it."""
        self.port = port
        log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        options = " ".join(
            [
                f"-p {port}",
                "-c listen_addresses=127.0.0.1",
                # The socket goes in our temp dir, not in /var/run/postgresql.
                f"-k {self.root}",
                # A test cluster: durability is not worth the fsyncs on a shared machine.
                "-c fsync=off",
                "-c synchronous_commit=off",
                "-c full_page_writes=off",
                "-c max_connections=200",
            ]
        )
        try:
            self._run(
                run_as,
                [
                    "pg_ctl",
                    "start",
                    "-D",
                    str(self.data_dir),
                    "-l",
                    str(self.log_path),
                    "-o",
                    options,
                    "-w",
                    "-t",
                    str(int(timeout_s)),
                ],
                timeout_s + 10,
            )
        except PostgresUnavailableError as error:
            if bind_failed(self._log_since(log_offset)):
                raise PortTakenError(f"PostgreSQL port {port} was taken") from error
            raise

    def _log_since(self, offset: int) -> str:
        """The server log from ``offset`` on: one attempt's lines, not those before it."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(offset)
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def _check_answers_as_itself(self) -> None:
        """Raise unless the server on our port serves our data directory."""
        try:
            with connect(**self.connect_kwargs()) as conn, conn.cursor() as cur:
                cur.execute("SHOW data_directory")
                row = cur.fetchone()
        except psycopg2.Error as error:
            raise PostgresUnavailableError(
                f"The server on port {self.port} refused this cluster's login: {error}"
            ) from error
        answered = Path(row[0]) if row else None
        if answered is None or answered.resolve() != self.data_dir.resolve():
            raise PostgresUnavailableError(
                f"The server on port {self.port} serves {answered}, not {self.data_dir}"
            )

    def _run(self, run_as: _RunAs, command: Sequence[str], timeout_s: float) -> None:
        program, *args = command
        result = subprocess.run(
            [str(self.bin_dir / program), *args],
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            # pg_ctl's postmaster would otherwise inherit the test's process group and Ctrl-C.
            start_new_session=True,
            **run_as.popen_kwargs(),
        )
        if result.returncode != 0:
            log = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
            raise PostgresUnavailableError(
                f"{program} exited {result.returncode}\nstdout:\n{result.stdout}\n"
                f"stderr:\n{result.stderr}\nserver log:\n{log[-4000:]}"
            )
