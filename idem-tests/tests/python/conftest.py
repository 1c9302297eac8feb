"""Fixtures for the end-to-end tests of the `payments` example server.

The server binary comes from $IDEM_PAYMENTS_BIN (scripts/test-python builds
it and sets it). Without it every test fails: these tests never skip.

Every server is started with `--store memory` or a fresh sqlite file under
pytest's tmp_path, never the default store (a persistent file in ./.idem).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

META_KEY = "idem/operation"
STARTUP_TIMEOUT_S = 20.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def payments_bin() -> str:
    path = os.environ.get("IDEM_PAYMENTS_BIN")
    if not path:
        pytest.fail(
            "IDEM_PAYMENTS_BIN is not set: run scripts/test-python, or build "
            "`cargo build --example payments` and point IDEM_PAYMENTS_BIN at the binary"
        )
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.fail(f"IDEM_PAYMENTS_BIN={path!r} is not an executable file")
    return path


# --- stdio -----------------------------------------------------------------


@dataclass
class StdioServer:
    """Opens MCP clients, each on a payments server process it launches over
    stdio (the mcp client stops the process when the client closes)."""

    bin: str
    log_dir: Path
    logs: list[IO[str]] = field(default_factory=list)

    def client(self, *args: str, mode: str = "auto", **options: Any) -> Client:
        """A client on a fresh server process started with `args` (the store
        flag is the caller's: give `--store memory` or a temp sqlite path);
        `options` go to `Client` (an `elicitation_callback`, say)."""
        assert "--store" in args, "always pass --store to the payments server"
        # The server's stderr goes to a file: pytest's captured sys.stderr has
        # no file descriptor for a child process to inherit.
        errlog = open(self.log_dir / f"stdio-{len(self.logs)}.stderr", "w")  # noqa: SIM115
        self.logs.append(errlog)
        params = StdioServerParameters(command=self.bin, args=["--transport", "stdio", *args])
        return Client(stdio_client(params, errlog=errlog), mode=mode, **options)


@pytest.fixture
def stdio_server(payments_bin: str, tmp_path: Path) -> Iterator[StdioServer]:
    server = StdioServer(payments_bin, tmp_path)
    try:
        yield server
    finally:
        for log in server.logs:
            log.close()


# --- HTTP ------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class HttpServer:
    """A payments server on streamable HTTP, run by the test."""

    process: subprocess.Popen[bytes]
    port: int
    stderr_path: Path
    tokens: dict[str, str] = field(default_factory=dict)  # token -> "tenant/subject"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def client(self, token: str | None, mode: str = "auto", **options: Any) -> Client:
        """An MCP client that sends `Authorization: Bearer <token>` (no
        Authorization header at all when token is None); `options` go to
        `Client` (an `elicitation_callback`, say)."""
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        http = create_mcp_http_client(headers=headers)
        return Client(streamable_http_client(self.url, http_client=http), mode=mode, **options)

    def raw_post(self, message: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
        """POSTs one JSON-RPC message with urllib, outside the MCP client:
        (status, headers, body)."""
        request = urllib.request.Request(
            self.url,
            data=json.dumps(message).encode(),
            method="POST",
            headers={
                "Content-Type": "application/json",
                "Accept": "application/json, text/event-stream",
                **(headers or {}),
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                # An accepted request answers with an SSE stream that stays
                # open; the first bytes are enough.
                return response.status, dict(response.headers), response.read1(4096).decode(errors="replace")
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), error.read().decode(errors="replace")

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""


def _wait_until_accepting(server: HttpServer) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(
                f"payments exited with {server.process.returncode} before listening on "
                f"{server.port}:\n{server.stderr()}"
            )
        try:
            with socket.create_connection(("127.0.0.1", server.port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"payments did not accept on port {server.port} within {STARTUP_TIMEOUT_S}s:\n{server.stderr()}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


@pytest.fixture
def http_server(payments_bin: str, tmp_path: Path) -> Iterator[Callable[..., HttpServer]]:
    """A factory: `http_server({"tok-a": "acme/alice"}, "--store", "memory")`
    starts a server on a free port, waits until it accepts, and returns it.
    Every server started is stopped at the end of the test."""
    started: list[HttpServer] = []

    def start(tokens: dict[str, str], *args: str) -> HttpServer:
        assert "--store" in args, "always pass --store to the payments server"
        last_error: Exception | None = None
        # A free port can be taken between finding it and the server binding
        # it: try a few.
        for attempt in range(3):
            port = free_port()
            stderr_path = tmp_path / f"http-{len(started)}-{attempt}.stderr"
            argv = [payments_bin, "--transport", "http", "--listen", f"127.0.0.1:{port}"]
            for token, who in tokens.items():
                argv += ["--token", f"{token}={who}"]
            argv += list(args)
            with open(stderr_path, "wb") as err:
                process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
            server = HttpServer(process, port, stderr_path, dict(tokens))
            started.append(server)
            try:
                _wait_until_accepting(server)
                return server
            except RuntimeError as error:
                _stop(process)
                last_error = error
        raise RuntimeError(f"could not start payments over HTTP: {last_error}")

    try:
        yield start
    finally:
        for server in started:
            _stop(server.process)
