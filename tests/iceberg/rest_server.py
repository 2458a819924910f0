"""A minimal Iceberg REST catalog server (stdlib http.server) over a pyiceberg SqlCatalog.

Enough of the REST spec for pyiceberg's RestCatalog client to create, load, commit (409 on a
lost compare-and-swap) and stage-create tables: a test fixture, not a product. Binds 127.0.0.1.

    with RestCatalogServer(sql_catalog) as server:
        catalog = RestCatalog("rest", uri=server.uri)
"""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

from pyiceberg.catalog.rest import CreateTableRequest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NoSuchNamespaceError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.table import CommitTableRequest, StagedTable
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER

_ERRORS = {
    CommitFailedException: 409,
    TableAlreadyExistsError: 409,
    NamespaceAlreadyExistsError: 409,
    NoSuchTableError: 404,
    NoSuchNamespaceError: 404,
}


def _table_response(table) -> bytes:
    return json.dumps(
        {
            "metadata-location": table.metadata_location,
            "metadata": json.loads(table.metadata.model_dump_json(by_alias=True)),
            "config": {},
        }
    ).encode()


class RestCatalogServer:
    def __init__(self, catalog: SqlCatalog) -> None:
        self.catalog = catalog
        # One lock per server: SqlCatalog's compare-and-swap is atomic anyway; this only keeps
        # SQLite from "database is locked" under the threaded server.
        self.lock = threading.Lock()
        handler = self._handler()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.uri = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "RestCatalogServer":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, code: int, body: bytes = b"") -> None:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _error(self, error: Exception) -> None:
                code = next((c for t, c in _ERRORS.items() if isinstance(error, t)), 500)
                body = {
                    "error": {"message": str(error), "type": type(error).__name__, "code": code}
                }
                self._send(code, json.dumps(body).encode())

            def _body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length", 0)))

            def _route(self) -> list[str]:
                parts = [unquote(p) for p in urlparse(self.path).path.strip("/").split("/")]
                assert parts[0] == "v1", parts
                return parts[1:]

            def _dispatch(self) -> None:
                try:
                    with server.lock:
                        self._handle(self._route())
                except Exception as error:
                    self._error(error)

            do_GET = do_POST = do_HEAD = do_DELETE = _dispatch

            def _handle(self, parts: list[str]) -> None:
                cat = server.catalog
                method = self.command
                if parts == ["config"]:
                    return self._send(200, json.dumps({"defaults": {}, "overrides": {}}).encode())
                if parts == ["namespaces"] and method == "POST":
                    payload = json.loads(self._body())
                    cat.create_namespace(tuple(payload["namespace"]), payload.get("properties", {}))
                    return self._send(200, json.dumps(payload).encode())
                if parts == ["namespaces"] and method == "GET":
                    names = [list(n) for n in cat.list_namespaces()]
                    return self._send(200, json.dumps({"namespaces": names}).encode())
                if len(parts) == 2 and parts[0] == "namespaces":
                    ns = tuple(parts[1].split("\x1f"))
                    if not cat.namespace_exists(ns):
                        raise NoSuchNamespaceError(parts[1])
                    props = cat.load_namespace_properties(ns)
                    return self._send(
                        200, json.dumps({"namespace": list(ns), "properties": props}).encode()
                    )
                if len(parts) == 3 and parts[2] == "tables" and method == "POST":
                    ns = tuple(parts[1].split("\x1f"))
                    payload = json.loads(self._body())
                    for optional in ("location", "partition-spec", "write-order"):
                        payload.setdefault(optional, None)
                    request = CreateTableRequest.model_validate(payload)
                    identifier = (*ns, request.name)
                    if request.stage_create:
                        if cat.table_exists(identifier):
                            raise TableAlreadyExistsError(".".join(identifier))
                        staged: StagedTable = cat._create_staged_table(
                            identifier,
                            request.table_schema,
                            request.location,
                            request.partition_spec or UNPARTITIONED_PARTITION_SPEC,
                            request.write_order or UNSORTED_SORT_ORDER,
                            request.properties,
                        )
                        return self._send(200, _table_response(staged))
                    table = cat.create_table(
                        identifier,
                        request.table_schema,
                        request.location,
                        request.partition_spec or UNPARTITIONED_PARTITION_SPEC,
                        request.write_order or UNSORTED_SORT_ORDER,
                        request.properties,
                    )
                    return self._send(200, _table_response(table))
                if len(parts) == 4 and parts[2] == "tables":
                    identifier = (*parts[1].split("\x1f"), parts[3])
                    if method in ("GET", "HEAD"):
                        table = cat.load_table(identifier)
                        return self._send(200 if method == "GET" else 204, _table_response(table))
                    if method == "DELETE":
                        cat.drop_table(identifier)
                        return self._send(204)
                    request = CommitTableRequest.model_validate_json(self._body())
                    try:
                        table = cat.load_table(identifier)
                    except NoSuchTableError:
                        # A staged create: commit_table creates the row, or raises
                        # TableAlreadyExistsError when another first writer won.
                        table = StagedTable(identifier, None, "", None, cat)  # type: ignore[arg-type]
                    response = cat.commit_table(table, request.requirements, request.updates)
                    body = {
                        "metadata-location": response.metadata_location,
                        "metadata": json.loads(response.metadata.model_dump_json(by_alias=True)),
                    }
                    return self._send(200, json.dumps(body).encode())
                self._send(
                    404,
                    json.dumps(
                        {"error": {"message": self.path, "type": "NotFound", "code": 404}}
                    ).encode(),
                )

        return Handler
