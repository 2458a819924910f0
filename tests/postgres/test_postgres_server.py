"""The throwaway server itself: reachable with its password only, gone after stop()."""

import os
import socket
import subprocess
from pathlib import Path

import psycopg2
import pytest
from postgres_server import PostgresServer, process_alive


def test_the_session_server_answers_on_loopback_with_its_password(
    postgres_server: PostgresServer,
) -> None:
    with psycopg2.connect(**postgres_server.connect_kwargs()) as conn, conn.cursor() as cur:
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


def test_install_script_does_nothing_once_postgres_is_there() -> None:
    script = Path(__file__).resolve().parents[2] / "scripts" / "install_postgres.sh"
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=False)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
