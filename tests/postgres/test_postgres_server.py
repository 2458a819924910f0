"""The throwaway server itself: reachable with its password only, gone after stop()."""

import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import psycopg2
import pytest
import sqlalchemy as sa
from dagster_postgres.utils import get_conn_string
from ports import bind_failed, every_other_pick
from postgres_server import PostgresServer, connect, process_alive


def test_the_session_server_answers_on_loopback_with_its_password(
    postgres_server: PostgresServer,
) -> None:
    with connect(**postgres_server.connect_kwargs()) as conn, conn.cursor() as cur:
        cur.execute("SELECT current_user, inet_server_addr()::text, current_setting('port')")
        assert cur.fetchone() == ("idem", "127.0.0.1/32", str(postgres_server.port))
        cur.execute("SELECT current_setting('server_version_num')::int >= 150000")
        assert cur.fetchone() == (True,)
    wrong = {**postgres_server.connect_kwargs(), "password": "wrong"}
    with pytest.raises(psycopg2.OperationalError, match="password authentication failed"):
        psycopg2.connect(**wrong)


def test_the_server_processes_do_not_run_as_root(postgres_server: PostgresServer) -> None:
    pid = postgres_server.postmaster_pid()
    assert pid is not None
    owner = os.stat(f"/proc/{pid}").st_uid
    if os.geteuid() == 0:
        assert owner != 0
    else:
        assert owner == os.geteuid()


def test_stop_removes_the_cluster_and_frees_the_port() -> None:
    server = PostgresServer.start()
    root, port = server.root, server.port
    pid = server.postmaster_pid()
    assert pid is not None
    assert server.psql("SELECT 1") == "1\n"
    server.stop()
    assert not root.exists()
    assert not process_alive(pid)
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0


def test_a_server_whose_port_is_taken_starts_on_another_and_serves_its_own_data(
    postgres_server: PostgresServer,
) -> None:
    # Another worker's cluster took the port chosen first, as happens under `make test`.
    taken = postgres_server.port
    with PostgresServer.start(choose_port=every_other_pick(taken)) as server:
        assert server.port != taken
        assert bind_failed(server.log_path.read_text())
        with connect(**server.connect_kwargs()) as conn, conn.cursor() as cur:
            cur.execute("SELECT current_setting('data_directory'), current_setting('port')")
            assert cur.fetchone() == (str(server.data_dir), str(server.port))
    with connect(**postgres_server.connect_kwargs()) as conn, conn.cursor() as cur:
        cur.execute("SHOW data_directory")
        assert cur.fetchone() == (str(postgres_server.data_dir),)


def test_the_documented_install_command_does_nothing_once_postgres_is_there() -> None:
    repo_root = Path(__file__).resolve().parents[2]
    docs = (repo_root / "docs" / "postgres.md").read_text().splitlines()
    (command,) = [line for line in docs if line.startswith("make ")]
    assert command == "make postgres-deps"
    # As typed in a shell: under `make test` the variables of the outer make would make this
    # one print its "Entering directory" lines.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    result = subprocess.run(
        shlex.split(command), cwd=repo_root, capture_output=True, text=True, check=False, env=env
    )
    assert (result.returncode, result.stderr) == (0, "")
    # make echoes the script it runs; the script itself prints nothing when initdb is there.
    assert result.stdout == "bash scripts/install_postgres.sh\n"


def test_the_instance_url_must_name_psycopg2(postgres_server: PostgresServer) -> None:
    # SQLAlchemy 2.1 resolves a bare postgresql:// to psycopg 3, which dagster-postgres lacks.
    assert sa.make_url(get_conn_string("u", "p", "h", "d")).get_dialect().driver == "psycopg"
    url = get_conn_string(
        postgres_server.user,
        postgres_server.password,
        postgres_server.host,
        postgres_server.dbname,
        str(postgres_server.port),
        scheme="postgresql+psycopg2",
    )
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT 1")).scalar() == 1
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    ("ci", "returncode", "outcome"),
    [("", 0, "1 skipped"), ("true", 1, "CI must run the PostgreSQL tests")],
    ids=["local", "ci"],
)
def test_missing_postgres_skips_locally_and_fails_under_ci(
    ci: str, returncode: int, outcome: str
) -> None:
    repo_root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "IDEM_PG_BIN": "/nonexistent", "CI": ci}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "tests/postgres/test_postgres_server.py::test_the_server_processes_do_not_run_as_root",
            "-q",
            "-p",
            "no:cacheprovider",
        ],
        cwd=repo_root,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == returncode, result.stdout
    assert outcome in result.stdout, result.stdout
    assert "No PostgreSQL server binaries in /nonexistent" in result.stdout
