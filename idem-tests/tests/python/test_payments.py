"""End-to-end tests of the `payments` example with the official Python MCP
client (`mcp` 2.3.0), over stdio and streamable HTTP.

Each test checks the far side too: `processor_ledger` counts, per reference,
the requests that reached the stub processor and carrier and the charges and
shipments they really made, so a retry that got past idem shows there,
whatever the replies say.
"""

from __future__ import annotations

import asyncio
import urllib.request
import re
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from conftest import META_KEY, HttpServer, StdioServer

pytestmark = pytest.mark.anyio

TEST_TIMEOUT_S = 60
CHARGE = {"card": "4242", "amount_cents": 1250, "currency": "usd"}
WRAPPED_TOOLS = {"charge_card", "create_shipment", "tap_to_pay"}
# Hinted without a record: its own code makes a repeat harmless.
BY_CONSTRUCTION_TOOLS = {"set_card_nickname"}
STATUS_TOOL = "get_operation_status"
# One request and one charge under a reference: what the ledger must show
# for an operation, however often it was called.
ONCE = {"requests": 1, "charges": 1}
EMPTY_LEDGER = {
    "processor": {},
    "carrier": {},
    "processor_requests": 0,
    "processor_charges": 0,
    "carrier_requests": 0,
    "carrier_shipments": 0,
    "mailer": {},
    "warehouse": {},
    "mailer_attempts": 0,
    "mailer_deliveries": 0,
    "warehouse_attempts": 0,
    "warehouse_deliveries": 0,
}


# --- helpers ---------------------------------------------------------------


def op(result: CallToolResult) -> dict[str, Any]:
    """The `_meta["idem/operation"]` of a wrapped tool's result."""
    assert result.meta is not None and META_KEY in result.meta, f"no {META_KEY} in {result!r}"
    return result.meta[META_KEY]


def text(result: CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if block.type == "text")


async def ledger(client: Client) -> dict[str, Any]:
    result = await client.call_tool("processor_ledger", {})
    assert not result.is_error, text(result)
    view = result.structured_content
    assert view is not None
    # The totals and the per-reference counts must agree.
    processor, carrier = view["processor"].values(), view["carrier"].values()
    assert view["processor_requests"] == sum(c["requests"] for c in processor)
    assert view["processor_charges"] == sum(c["charges"] for c in processor)
    assert view["carrier_requests"] == sum(c["requests"] for c in carrier)
    assert view["carrier_shipments"] == sum(c["shipments"] for c in carrier)
    # The stubs deduplicate by reference: never two effects for one.
    assert all(c["charges"] <= 1 for c in processor), view
    assert all(c["shipments"] <= 1 for c in carrier), view
    # The mailer and the warehouse dedupe by the follow-on's downstream key.
    mailer, warehouse = view["mailer"].values(), view["warehouse"].values()
    assert view["mailer_attempts"] == sum(c["attempts"] for c in mailer)
    assert view["mailer_deliveries"] == sum(c["deliveries"] for c in mailer)
    assert view["warehouse_attempts"] == sum(c["attempts"] for c in warehouse)
    assert view["warehouse_deliveries"] == sum(c["deliveries"] for c in warehouse)
    assert all(c["deliveries"] <= 1 for c in [*mailer, *warehouse]), view
    return view


def assert_receipt(result: CallToolResult, *, replayed: bool) -> str:
    """A charge that completed: returns its reference."""
    assert not result.is_error, text(result)
    meta = op(result)
    assert meta["state"] == ("replayed" if replayed else "executed")
    assert meta["replayed"] is replayed
    receipt = result.structured_content
    assert receipt is not None
    assert receipt["amount_cents"] == CHARGE["amount_cents"]
    assert receipt["currency"] == CHARGE["currency"]
    assert re.fullmatch(r"ch_\d+", receipt["charge_id"])
    # The processor was given the operation's reference as its own key.
    assert receipt["reference"] == meta["reference"]
    return meta["reference"]


def exceptions_in(error: BaseException) -> list[BaseException]:
    """`error` and, for an exception group, every exception inside it."""
    if isinstance(error, BaseExceptionGroup):
        return [e for inner in error.exceptions for e in exceptions_in(inner)]
    return [error]


@pytest.fixture(params=["auto", "legacy"])
def mode(request: pytest.FixtureRequest) -> str:
    """The client's connect mode: "auto" (server/discover first; the payments
    server answers it, so the 2026-07-28 protocol) and "legacy" (the
    initialize handshake, 2025-11-25)."""
    return request.param


# --- follow-on work through the dispatcher ------------------------------------


async def test_stdio_a_receipt_is_mailed_once_across_retries_and_replays(
    stdio_server: StdioServer,
) -> None:
    """The receipt is a follow-on job: the stub mailer fails its first two
    requests, the dispatcher retries, one receipt goes out; a replay of the
    charge queues nothing, so the mailer sees nothing more."""
    args = (
        "--store", "memory",
        "--mailer-failures", "2",
        "--follow-on-interval-ms", "20",
        "--follow-on-backoff-ms", "20",
    )  # fmt: skip
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with stdio_server.client(*args) as client:
            reference = assert_receipt(
                await client.call_tool("charge_card", dict(CHARGE)), replayed=False
            )
            while (await ledger(client))["mailer_deliveries"] < 1:
                await anyio.sleep(0.05)
            assert_receipt(await client.call_tool("charge_card", dict(CHARGE)), replayed=True)
            await anyio.sleep(0.3)
            view = await ledger(client)
            assert view["mailer"] == {reference: {"attempts": 3, "deliveries": 1}}, view


# --- a charge still in flight when the tool stops waiting -------------------

PROCESSOR_DELAY_S = 4.0
# The charge is made at 4 s; the record is asked about again at most ~4 s
# later (a 250 ms backoff doubling), so 20 s leaves a wide margin.
RESOLVED_WITHIN_S = 20.0


@pytest.mark.parametrize("settle_ms", ["60000", "300"], ids=["settle-60s", "settle-at-timeout"])
async def test_stdio_a_charge_in_flight_at_the_processor_is_never_run_again(
    stdio_server: StdioServer, settle_ms: str
) -> None:
    """Issue "at most once through timeouts, sweeps and reconciles" (a).

    The tool stops waiting after 300 ms while the processor takes 4 s: the
    answer is failed_unknown. Maintenance rounds run every 500 ms, and the
    reconciler asks the processor about the reference while the charge is
    still in flight there: the record must stay UNKNOWN, so a repeat does not
    reach the processor. Once the charge is made, a round resolves the record
    to the processor's receipt, and a repeat replays it.

    With a 60 s settle, the library's settle period alone would hold off a
    wrong "not performed"; with the settle at its minimum (the processor
    timeout), only the reconciler's answer "still in flight" does: both must
    hold.
    """
    args = (
        "--store", "memory",
        "--processor-delay-ms", str(int(PROCESSOR_DELAY_S * 1000)),
        "--processor-timeout-ms", "300",
        "--maintenance-interval-ms", "500",
        "--reconcile-backoff-ms", "250",
        "--settle-ms", settle_ms,
    )  # fmt: skip
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with stdio_server.client(*args) as client:
            started = time.monotonic()
            first = await client.call_tool("charge_card", dict(CHARGE))
            reference = op(first)["reference"]

            # Several maintenance rounds while the charge is in flight.
            await anyio.sleep(1.5)
            status_in_flight = await client.call_tool(STATUS_TOOL, {"reference": reference})
            repeat_in_flight = await client.call_tool("charge_card", dict(CHARGE))
            view_in_flight = await ledger(client)
            in_flight_until = time.monotonic() - started
            assert in_flight_until < PROCESSOR_DELAY_S, (
                f"the checks meant for a charge in flight ran {in_flight_until:.1f} s in; "
                "the machine is too slow for this test's timings"
            )

            # The processor finishes; a round reconciles the record.
            while True:
                status = await client.call_tool(STATUS_TOOL, {"reference": reference})
                assert not status.is_error, text(status)
                if status.structured_content["state"] != "UNKNOWN":
                    break
                assert time.monotonic() - started < RESOLVED_WITHIN_S, (
                    f"not resolved {RESOLVED_WITHIN_S} s after the call", status.structured_content
                )
                await anyio.sleep(0.2)
            resolved_after = time.monotonic() - started
            repeat_after = await client.call_tool("charge_card", dict(CHARGE))
            view_after = await ledger(client)

    # The first call: the tool stopped waiting; the outcome is unknown.
    assert first.is_error
    assert op(first)["state"] == "failed_unknown"
    assert first.structured_content is None
    assert STATUS_TOOL in text(first)

    # While the charge is in flight at the processor: still UNKNOWN (not
    # released as "not performed"), and a repeat runs nothing.
    assert not status_in_flight.is_error, text(status_in_flight)
    assert status_in_flight.structured_content["state"] == "UNKNOWN", status_in_flight.structured_content
    assert repeat_in_flight.is_error
    assert op(repeat_in_flight)["state"] == "unknown", op(repeat_in_flight)
    assert op(repeat_in_flight)["reference"] == reference
    assert repeat_in_flight.structured_content is None
    # The far side: the one request arrived, its charge is not made yet.
    assert view_in_flight["processor"] == {reference: {"requests": 1, "charges": 0}}, view_in_flight

    # Resolved to the processor's receipt, only once the charge was made.
    assert resolved_after >= PROCESSOR_DELAY_S, resolved_after
    report = status.structured_content
    assert report["state"] == "COMPLETED", report
    assert report["tool"] == "charge_card"
    receipt = report["response"]["structuredContent"]
    assert receipt["reference"] == reference
    assert receipt["amount_cents"] == CHARGE["amount_cents"]

    # A repeat replays that receipt; nothing reached the processor again.
    assert assert_receipt(repeat_after, replayed=True) == reference
    assert repeat_after.structured_content == receipt
    assert [b.model_dump(by_alias=True, exclude_none=True) for b in repeat_after.content] == report["response"]["content"]
    assert view_after["processor"] == {reference: ONCE}, view_after
    assert view_after["processor_requests"] == 1
    assert view_after["processor_charges"] == 1


# --- stdio -----------------------------------------------------------------


async def test_stdio_idempotent_hint_on_exactly_the_wrapped_tools(stdio_server: StdioServer, mode: str) -> None:
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with stdio_server.client("--store", "memory", mode=mode) as client:
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            version = client.protocol_version

    # Both protocol eras are covered: see the `mode` fixture.
    expected_versions = MODERN_PROTOCOL_VERSIONS if mode == "auto" else HANDSHAKE_PROTOCOL_VERSIONS
    assert version in expected_versions, (mode, version)

    assert set(tools) == WRAPPED_TOOLS | BY_CONSTRUCTION_TOOLS | {STATUS_TOOL, "processor_ledger"}
    hinted = {
        name
        for name, tool in tools.items()
        if tool.annotations is not None and tool.annotations.idempotent_hint is True
    }
    assert hinted == WRAPPED_TOOLS | BY_CONSTRUCTION_TOOLS
    for name in BY_CONSTRUCTION_TOOLS:
        marker = tools[name].meta["idem/idempotent"]
        assert marker["byConstruction"].startswith("sets the card's nickname"), marker
        assert "statusTool" not in marker
    # As it is on the wire.
    for name in WRAPPED_TOOLS:
        wire = tools[name].model_dump(by_alias=True, exclude_none=True)
        assert wire["annotations"]["idempotentHint"] is True
        marker = wire["_meta"]["idem/idempotent"]
        assert marker["statusTool"] == STATUS_TOOL
    assert tools["charge_card"].meta["idem/idempotent"]["windowSeconds"] == 15 * 60
    assert tools["create_shipment"].meta["idem/idempotent"]["businessKey"] == ["order_id"]
    for name in (STATUS_TOOL, "processor_ledger"):
        assert tools[name].annotations is not None
        assert tools[name].annotations.read_only_hint is True
        assert not tools[name].annotations.idempotent_hint


async def test_stdio_concurrent_identical_charges_reach_the_processor_once(stdio_server: StdioServer, mode: str) -> None:
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with stdio_server.client("--store", "memory", "--processor-delay-ms", "1500", mode=mode) as client:
            first, second = await asyncio.gather(
                client.call_tool("charge_card", dict(CHARGE)),
                client.call_tool("charge_card", dict(CHARGE)),
            )
            after_race = await ledger(client)
            repeat = await client.call_tool("charge_card", dict(CHARGE))
            after_repeat = await ledger(client)

    # Exactly one of the two ran; which one is up to the scheduler.
    answers = sorted([first, second], key=lambda r: bool(r.is_error))
    receipt, busy = answers
    assert [bool(r.is_error) for r in answers] == [False, True], (text(first), text(second))

    reference = assert_receipt(receipt, replayed=False)
    assert reference.startswith("idem_")

    busy_meta = op(busy)
    assert busy_meta["state"] == "in_progress"
    assert busy_meta["reference"] == reference
    assert busy_meta["replayed"] is False
    assert busy_meta["statusTool"] == STATUS_TOOL
    assert busy_meta["retryAfterSeconds"] >= 1
    assert busy.structured_content is None
    assert reference in text(busy)
    assert STATUS_TOOL in text(busy)

    # The far side: one request and one charge, under that reference.
    assert after_race["processor"] == {reference: ONCE}
    assert after_race["processor_requests"] == 1

    # A repeat after completion replays the same answer and charges nothing.
    assert assert_receipt(repeat, replayed=True) == reference
    assert repeat.structured_content == receipt.structured_content
    assert text(repeat) == text(receipt)
    assert [b.model_dump() for b in repeat.content] == [b.model_dump() for b in receipt.content]
    assert after_repeat["processor"] == {reference: ONCE}
    assert after_repeat["processor_requests"] == 1


async def test_stdio_shipment_replays_and_conflicts_on_its_business_key(stdio_server: StdioServer) -> None:
    order = {"order_id": "ord-1001", "address": "1 Main St", "service_level": "standard"}
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with stdio_server.client("--store", "memory", "--processor-delay-ms", "50") as client:
            shipped = await client.call_tool("create_shipment", dict(order))
            again = await client.call_tool("create_shipment", dict(order))
            other = await client.call_tool("create_shipment", {**order, "service_level": "express"})
            view = await ledger(client)

    assert not shipped.is_error, text(shipped)
    reference = op(shipped)["reference"]
    assert op(shipped)["replayed"] is False
    assert shipped.structured_content["reference"] == reference

    assert not again.is_error, text(again)
    assert op(again) == {"reference": reference, "state": "replayed", "replayed": True, "keyedBy": "businessKey"}
    assert again.structured_content == shipped.structured_content

    # Same order id, other details: refused as a conflict, nothing shipped.
    assert other.is_error
    assert op(other)["state"] == "conflict"
    assert op(other)["reference"] == reference
    assert other.structured_content is None

    assert view["carrier"] == {reference: {"requests": 1, "shipments": 1}}
    assert view["carrier_requests"] == 1
    assert view["processor_requests"] == 0


async def test_stdio_sqlite_store_replays_after_a_restart(stdio_server: StdioServer, tmp_path: Path) -> None:
    store = f"sqlite:{tmp_path / 'payments.sqlite3'}"
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with stdio_server.client("--store", store, "--processor-delay-ms", "50") as client:
            first = await client.call_tool("charge_card", dict(CHARGE))
            first_view = await ledger(client)
        # A new process on the same store: its processor starts with a clean ledger.
        async with stdio_server.client("--store", store, "--processor-delay-ms", "50") as client:
            repeat = await client.call_tool("charge_card", dict(CHARGE))
            status = await client.call_tool(STATUS_TOOL, {"reference": op(first)["reference"]})
            second_view = await ledger(client)

    reference = assert_receipt(first, replayed=False)
    assert first_view["processor"] == {reference: ONCE}
    assert assert_receipt(repeat, replayed=True) == reference
    assert repeat.structured_content == first.structured_content
    assert text(repeat) == text(first)
    assert second_view["processor_requests"] == 0, second_view
    assert not status.is_error, text(status)
    assert status.structured_content["reference"] == reference
    assert status.structured_content["state"].lower() == "completed"


# --- HTTP ------------------------------------------------------------------

TOKENS = {"tok-acme": "acme/alice", "tok-globex": "globex/bob"}


async def test_http_two_tenants_with_identical_arguments_are_two_charges(http_server, mode: str) -> None:
    server: HttpServer = http_server(TOKENS, "--store", "memory", "--processor-delay-ms", "300")
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with server.client("tok-acme", mode) as acme, server.client("tok-globex", mode) as globex:
            # At the same time: one tenant's charge must not hold up the other's.
            from_acme, from_globex = await asyncio.gather(
                acme.call_tool("charge_card", dict(CHARGE)),
                globex.call_tool("charge_card", dict(CHARGE)),
            )
            view = await ledger(acme)
            # Each tenant's repeat replays its own charge.
            acme_again = await acme.call_tool("charge_card", dict(CHARGE))
            globex_again = await globex.call_tool("charge_card", dict(CHARGE))
            view_after = await ledger(globex)

    ref_acme = assert_receipt(from_acme, replayed=False)
    ref_globex = assert_receipt(from_globex, replayed=False)
    assert ref_acme != ref_globex
    assert (
        from_acme.structured_content["charge_id"]
        != from_globex.structured_content["charge_id"]
    )

    assert view["processor"] == {ref_acme: ONCE, ref_globex: ONCE}
    assert view["processor_requests"] == 2
    assert view["processor_charges"] == 2

    assert assert_receipt(acme_again, replayed=True) == ref_acme
    assert acme_again.structured_content == from_acme.structured_content
    assert assert_receipt(globex_again, replayed=True) == ref_globex
    assert globex_again.structured_content == from_globex.structured_content
    assert view_after == view


async def test_http_status_of_another_tenants_reference_is_not_found(http_server, mode: str) -> None:
    server: HttpServer = http_server(TOKENS, "--store", "memory", "--processor-delay-ms", "50")
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with server.client("tok-acme", mode) as acme, server.client("tok-globex", mode) as globex:
            charged = await acme.call_tool("charge_card", dict(CHARGE))
            reference = assert_receipt(charged, replayed=False)
            seen_by_globex = await globex.call_tool(STATUS_TOOL, {"reference": reference})
            seen_by_acme = await acme.call_tool(STATUS_TOOL, {"reference": reference})
            view = await ledger(globex)

    # Tenant B: not found, and nothing of A's operation leaks.
    assert seen_by_globex.is_error
    assert seen_by_globex.structured_content is None
    message = text(seen_by_globex)
    assert re.search(r"no operation .* was found", message, re.IGNORECASE), message
    assert reference in message  # only because B sent it
    charge_id = charged.structured_content["charge_id"]
    assert charge_id not in message
    assert "1250" not in message

    # Tenant A: found, completed, with the stored receipt.
    assert not seen_by_acme.is_error, text(seen_by_acme)
    report = seen_by_acme.structured_content
    assert report["reference"] == reference
    assert report["tool"] == "charge_card"
    assert report["state"].lower() == "completed"
    # The stored response is the tool result the first call returned, as JSON.
    assert report["response"]["structuredContent"]["charge_id"] == charge_id

    # Looking up changed nothing at the processor.
    assert view["processor"] == {reference: ONCE}
    assert view["processor_requests"] == 1


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "idem-e2e", "version": "0"},
    },
}
CHARGE_CALL = {
    "jsonrpc": "2.0",
    "id": 2,
    "method": "tools/call",
    "params": {"name": "charge_card", "arguments": CHARGE},
}


async def test_http_missing_or_unknown_token_is_401_and_runs_nothing(http_server) -> None:
    server: HttpServer = http_server(TOKENS, "--store", "memory", "--processor-delay-ms", "50")
    refused_headers = {
        "no Authorization": {},
        "unknown token": {"Authorization": "Bearer tok-nobody"},
        "empty token": {"Authorization": "Bearer "},
        "other scheme": {"Authorization": "Basic tok-acme"},
        "token without scheme": {"Authorization": "tok-acme"},
    }
    with anyio.fail_after(TEST_TIMEOUT_S):
        for what, headers in refused_headers.items():
            for message in (INITIALIZE, CHARGE_CALL):
                status, response_headers, body = await anyio.to_thread.run_sync(server.raw_post, message, headers)
                assert status == 401, (what, message["method"], status, body)
                assert response_headers.get("www-authenticate", response_headers.get("WWW-Authenticate")) == "Bearer"
                assert "bearer token" in body

        # The same raw request with a good token is accepted: the 401s above
        # were about the token, not the request.
        status, _, body = await anyio.to_thread.run_sync(
            server.raw_post, INITIALIZE, {"Authorization": "Bearer tok-acme"}
        )
        assert status == 200, body

        # The MCP client cannot connect without a good token either.
        for token in ("tok-nobody", None):
            with pytest.raises(Exception) as caught:
                async with server.client(token) as client:
                    await client.call_tool("charge_card", dict(CHARGE))
            found = exceptions_in(caught.value)
            assert any(isinstance(e, MCPError) for e in found), found

        # Nothing ran.
        async with server.client("tok-globex") as client:
            view = await ledger(client)
    assert view == EMPTY_LEDGER


# --- metrics ---------------------------------------------------------------


def scrape(server: HttpServer) -> str:
    """GET /metrics, without a token (the route is outside the token check)."""
    url = f"http://127.0.0.1:{server.port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        return response.read().decode()


def sample(metrics: str, name: str, **labels: str) -> float | None:
    """The value of the Prometheus sample `name` with exactly these labels."""
    for line in metrics.splitlines():
        m = re.fullmatch(r"(\w+)(?:\{(.*)\})? (\S+)", line)
        if not m or m.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if found == labels:
            return float(m.group(3))
    return None


async def test_http_metrics_count_calls_by_tool_and_state(http_server) -> None:
    server: HttpServer = http_server(TOKENS, "--store", "memory", "--processor-delay-ms", "50")
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with server.client("tok-acme") as acme:
            first = await acme.call_tool("charge_card", dict(CHARGE))
            again = await acme.call_tool("charge_card", dict(CHARGE))
    assert op(first)["state"] == "executed" and op(again)["state"] == "replayed"

    metrics = scrape(server)
    assert sample(metrics, "idem_calls_total", tool="charge_card", state="executed") == 1, metrics
    assert sample(metrics, "idem_calls_total", tool="charge_card", state="replayed") == 1, metrics
    # The store's latencies, by store and step; never a tenant or a reference.
    assert re.search(r'idem_store_seconds\w*\{[^}]*op="claim"', metrics), metrics
    assert "acme" not in metrics
    assert op(first)["reference"] not in metrics
