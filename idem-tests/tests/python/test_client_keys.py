"""Client keys with the official Python MCP client (`mcp` 2.3.0) against the
`payments` example, on the modern protocol (`server/discover`) and the
legacy handshake, over stdio and streamable HTTP.

A host names an operation with `params._meta["idem/idempotency-key"]`, or
over HTTP the `Idempotency-Key` header. `charge_card` and `tap_to_pay` opted
in. Every test counts the charges the stub processor really made.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_types import CallToolResult

from conftest import META_KEY, HttpServer, StdioServer

pytestmark = pytest.mark.anyio

TEST_TIMEOUT_S = 60
KEY_META = "idem/idempotency-key"
TOKENS = {"tok-alice": "acme/alice", "tok-bob": "acme/bob"}


def charge(cents: int) -> dict[str, Any]:
    return {"card": "4242", "amount_cents": cents, "currency": "usd"}


def op(result: CallToolResult) -> dict[str, Any]:
    assert result.meta is not None and META_KEY in result.meta, f"no {META_KEY} in {result!r}"
    return result.meta[META_KEY]


def text(result: CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if block.type == "text")


async def call(client: Client, tool: str, args: dict[str, Any], key: Any = None) -> CallToolResult:
    meta = None if key is None else {KEY_META: key}
    return await client.call_tool(tool, args, meta=meta)


async def charges(client: Client) -> int:
    result = await client.call_tool("processor_ledger", {})
    assert not result.is_error, text(result)
    view = result.structured_content
    assert view is not None
    # The stub dedupes by reference: never two charges for one operation.
    assert all(c["charges"] <= 1 for c in view["processor"].values()), view
    return view["processor_charges"]


@pytest.fixture(params=["auto", "legacy"])
def mode(request: pytest.FixtureRequest) -> str:
    return request.param


def keyed_client(server: HttpServer, token: str, key: str | None, mode: str = "auto") -> Client:
    """A client that sends `Idempotency-Key: key` on every request."""
    headers = {"Authorization": f"Bearer {token}"}
    if key is not None:
        headers["Idempotency-Key"] = key
    http = create_mcp_http_client(headers=headers)
    return Client(streamable_http_client(server.url, http_client=http), mode=mode)


async def keys_in_meta(client: Client) -> None:
    for tool in ("charge_card", "tap_to_pay"):
        before = await charges(client)
        first = await call(client, tool, charge(1200), "order-1/step-1")
        assert op(first)["state"] == "executed", text(first)
        assert op(first)["keyedBy"] == "clientKey"
        again = await call(client, tool, charge(1200), "order-1/step-1")
        assert op(again)["state"] == "replayed", text(again)
        assert op(again)["reference"] == op(first)["reference"]
        assert again.structured_content == first.structured_content

        other = await call(client, tool, charge(9900), "order-1/step-1")
        assert other.is_error
        assert op(other)["state"] == "conflict", text(other)
        assert op(other)["reference"] == op(first)["reference"]
        assert "new idempotency key" in text(other)

        second = await call(client, tool, charge(1200), "order-2/step-1")
        assert op(second)["state"] == "executed", "another key is another charge"
        assert op(second)["reference"] != op(first)["reference"]

        for bad in ["", "has space", "caf\u00e9", "k" * 256, 42]:
            refused = await call(client, tool, charge(1300), bad)
            assert refused.is_error
            assert op(refused)["state"] == "refused", (bad, text(refused))
            assert "1 to 255 visible ASCII" in text(refused)

        unkeyed = await call(client, tool, charge(1400))
        assert op(unkeyed)["keyedBy"] == "arguments"
        assert await charges(client) - before == 3, tool


async def test_stdio_keys_in_meta(stdio_server: StdioServer, mode: str) -> None:
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with stdio_server.client("--store", "memory", mode=mode) as client:
            await keys_in_meta(client)


async def test_http_keys_in_meta(http_server, mode: str) -> None:
    server: HttpServer = http_server(TOKENS, "--store", "memory")
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with server.client("tok-alice", mode) as client:
            await keys_in_meta(client)


async def a_key_reused_after_the_window(client: Client) -> None:
    """`tap_to_pay`'s window is 5 s; the key's retention is 24 h."""
    first = await call(client, "tap_to_pay", charge(450), "till-7/sale-31")
    unkeyed = await call(client, "tap_to_pay", charge(460))
    assert [op(first)["state"], op(unkeyed)["state"]] == ["executed", "executed"]
    await asyncio.sleep(5.5)
    later = await call(client, "tap_to_pay", charge(450), "till-7/sale-31")
    assert op(later)["state"] == "replayed", text(later)
    assert op(later)["reference"] == op(first)["reference"]
    unkeyed_later = await call(client, "tap_to_pay", charge(460))
    assert op(unkeyed_later)["state"] == "executed", "past the window, a new tap"
    assert await charges(client) == 3


async def test_stdio_a_key_reused_after_the_window_replays(stdio_server: StdioServer) -> None:
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with stdio_server.client("--store", "memory") as client:
            await a_key_reused_after_the_window(client)


async def test_http_a_key_reused_after_the_window_replays(http_server) -> None:
    server: HttpServer = http_server(TOKENS, "--store", "memory")
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with server.client("tok-alice") as client:
            await a_key_reused_after_the_window(client)


async def test_http_the_idempotency_key_header(http_server, mode: str) -> None:
    server: HttpServer = http_server(TOKENS, "--store", "memory")
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with keyed_client(server, "tok-alice", "gateway-req-1", mode) as keyed:
            first = await call(keyed, "charge_card", charge(2500))
            assert op(first)["state"] == "executed", text(first)
            assert op(first)["keyedBy"] == "clientKey"
            again = await call(keyed, "charge_card", charge(2500))
            assert op(again)["state"] == "replayed", text(again)
            same = await call(keyed, "charge_card", charge(2500), "gateway-req-1")
            assert op(same)["state"] == "replayed", "header and _meta agree"
            both = await call(keyed, "charge_card", charge(2600), "another-key")
            assert op(both)["state"] == "refused", text(both)
            assert "two different idempotency keys" in text(both)
        async with keyed_client(server, "tok-alice", "two words", mode) as invalid:
            refused = await call(invalid, "charge_card", charge(2700))
            assert op(refused)["state"] == "refused", text(refused)
        async with server.client("tok-alice", mode) as plain:
            via_meta = await call(plain, "charge_card", charge(2500), "gateway-req-1")
            assert op(via_meta)["state"] == "replayed", "a key is a key, from _meta or the header"
            assert op(via_meta)["reference"] == op(first)["reference"]
            assert await charges(plain) == 1


async def test_http_another_callers_identical_key_is_its_own_charge(http_server) -> None:
    server: HttpServer = http_server(TOKENS, "--store", "memory")
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with server.client("tok-alice") as alice, server.client("tok-bob") as bob:
            a = await call(alice, "charge_card", charge(3000), "k-1")
            b = await call(bob, "charge_card", charge(3000), "k-1")
            assert [op(a)["state"], op(b)["state"]] == ["executed", "executed"]
            assert op(a)["reference"] != op(b)["reference"]
            b_again = await call(bob, "charge_card", charge(3000), "k-1")
            assert op(b_again)["reference"] == op(b)["reference"]
            assert await charges(alice) == 2


async def test_stdio_another_callers_identical_key_is_its_own_charge(stdio_server: StdioServer, tmp_path: Path) -> None:
    """Over stdio the caller is the process's `--tenant`/`--subject`: three
    processes on one store file, Alice twice and Bob once. Bob's identical key
    is his own charge, by his process's processor; Alice's second process
    replays her charge and charges nothing, so the store is shared."""
    store = f"sqlite:{tmp_path / 'payments.sqlite3'}"

    def as_caller(subject: str) -> Client:
        return stdio_server.client("--store", store, "--tenant", "acme", "--subject", subject)

    with anyio.fail_after(TEST_TIMEOUT_S):
        async with as_caller("alice") as alice:
            a = await call(alice, "charge_card", charge(3000), "k-1")
            async with as_caller("bob") as bob:
                b = await call(bob, "charge_card", charge(3000), "k-1")
                b_again = await call(bob, "charge_card", charge(3000), "k-1")
                assert [await charges(alice), await charges(bob)] == [1, 1]
        async with as_caller("alice") as alice_again:
            a_again = await call(alice_again, "charge_card", charge(3000), "k-1")
            assert await charges(alice_again) == 0
    assert [op(a)["state"], op(b)["state"]] == ["executed", "executed"], text(b)
    assert op(a)["reference"] != op(b)["reference"]
    assert op(b_again)["state"] == "replayed" and op(b_again)["reference"] == op(b)["reference"]
    assert op(a_again)["state"] == "replayed" and op(a_again)["reference"] == op(a)["reference"]


async def test_stdio_the_listing_says_clientkey(stdio_server: StdioServer) -> None:
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with stdio_server.client("--store", "memory") as client:
            listed = await client.list_tools()
    markers = {t.name: (t.meta or {}).get("idem/idempotent", {}) for t in listed.tools}
    assert markers["charge_card"].get("clientKey") == "optional"
    assert markers["tap_to_pay"].get("clientKey") == "optional"
    assert "clientKey" not in markers["create_shipment"]
