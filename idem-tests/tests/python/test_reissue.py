"""The protocol's own retry path with the official Python MCP client (`mcp`
2.3.0) on the modern protocol over streamable HTTP (stateless: 2026-07-28
has no sessions): a response stream broken mid-call, and the call re-issued
under a new request id, as the specification says a client MUST. The
re-issue is told "in progress", then gets the stored receipt; the stub
processor charged once.
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import anyio
import pytest
from mcp_types import CallToolResult

from conftest import META_KEY, HttpServer

pytestmark = pytest.mark.anyio

CHARGE = {"card": "4242", "amount_cents": 5150, "currency": "usd"}


def op(result: CallToolResult) -> dict[str, Any]:
    assert result.meta is not None and META_KEY in result.meta, f"no {META_KEY} in {result!r}"
    return result.meta[META_KEY]


def call_and_drop(server: HttpServer, token: str, after_s: float) -> None:
    """POSTs `tools/call` as a 2026-07-28 client over a bare socket, and
    closes the connection after `after_s`, before any answer."""
    body = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {
                "name": "charge_card",
                "arguments": CHARGE,
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientInfo": {"name": "dropped", "version": "0"},
                    "io.modelcontextprotocol/clientCapabilities": {},
                },
            },
        }
    ).encode()
    head = (
        f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        "Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\n"
        "Mcp-Method: tools/call\r\nMcp-Name: charge_card\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as conn:
        conn.sendall(head + body)
        conn.settimeout(after_s)
        received = b""
        try:
            while True:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                received += chunk
        except TimeoutError:
            pass
        assert b"charge_id" not in received, f"answered before the drop: {received!r}"


async def test_http_a_call_reissued_after_a_dropped_stream_charges_once(http_server) -> None:
    server: HttpServer = http_server({"tok-acme": "acme/alice"}, "--store", "memory", "--processor-delay-ms", "2000")
    with anyio.fail_after(60):
        await anyio.to_thread.run_sync(call_and_drop, server, "tok-acme", 0.5)
        async with server.client("tok-acme", "auto") as client:
            reissued = await client.call_tool("charge_card", dict(CHARGE))
            assert reissued.is_error
            assert op(reissued)["state"] == "in_progress", reissued
            reference = op(reissued)["reference"]
            answer = reissued
            for _ in range(40):
                await asyncio.sleep(0.25)
                answer = await client.call_tool("charge_card", dict(CHARGE))
                if op(answer)["state"] != "in_progress":
                    break
            assert op(answer)["state"] == "replayed", answer
            assert op(answer)["reference"] == reference
            assert answer.structured_content["reference"] == reference
            ledger = (await client.call_tool("processor_ledger", {})).structured_content
    assert ledger["processor_requests"] == 1, ledger
    assert ledger["processor_charges"] == 1, ledger
