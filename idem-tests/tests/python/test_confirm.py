"""The payments example's confirmation before a large charge, driven by the
official Python MCP SDK on the modern protocol (2026-07-28, `server/discover`),
over stdio and streamable HTTP, and its tool idempotent by construction.

`charge_card` asks from `amount_cents >= 100000`: `resultType:
"input_required"` with a form-mode elicitation under `confirm` whose schema
has a boolean `confirm`. The SDK answers it through an `elicitation_callback`
(`Client.call_tool` drives the rounds), or the test drives the rounds itself
(`client.session.call_tool(..., allow_input_required=True)`). The stub
processor's ledger counts every charge request, so a second charge would
show.
"""

from __future__ import annotations

from typing import Any, Callable

import anyio
import pytest
from mcp import Client
from mcp_types import CallToolResult, ElicitResult, InputRequiredResult

from conftest import META_KEY, HttpServer, StdioServer

pytestmark = pytest.mark.anyio

TEST_TIMEOUT_S = 60
LARGE = {"card": "4242", "amount_cents": 150_000, "currency": "usd"}
TOKENS = {"tok-acme": "acme/alice"}


def op(result: CallToolResult) -> dict[str, Any]:
    assert result.meta is not None and META_KEY in result.meta, f"no {META_KEY} in {result!r}"
    return result.meta[META_KEY]


def text(result: CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if block.type == "text")


async def charges(client: Client) -> int:
    result = await client.call_tool("processor_ledger", {})
    assert not result.is_error, text(result)
    assert result.structured_content is not None
    return result.structured_content["processor_requests"]


class User:
    """An elicitation callback: the user's answer, and how often asked."""

    def __init__(self, action: str, confirm: bool | None = None) -> None:
        self.action = action
        self.confirm = confirm
        self.asked: list[Any] = []

    async def __call__(self, context: Any, params: Any) -> ElicitResult:
        self.asked.append(params)
        assert params.mode == "form", params
        schema = params.requested_schema
        properties = schema["properties"] if isinstance(schema, dict) else schema.properties
        confirm_schema = properties["confirm"]
        kind = confirm_schema["type"] if isinstance(confirm_schema, dict) else confirm_schema.type
        assert kind == "boolean", schema
        if self.action != "accept":
            return ElicitResult(action=self.action)
        return ElicitResult(action="accept", content={"confirm": self.confirm})


Connect = Callable[..., Client]


@pytest.fixture(params=["stdio", "http"])
def connect(request: pytest.FixtureRequest, stdio_server: StdioServer, http_server: Callable[..., HttpServer]) -> Connect:
    """`connect(mode=..., elicitation_callback=...)`: a client on a fresh
    payments server (memory store) over the parametrized transport."""
    if request.param == "stdio":
        return lambda **options: stdio_server.client("--store", "memory", **options)
    server = http_server(TOKENS, "--store", "memory")
    return lambda **options: server.client("tok-acme", **options)


async def test_a_confirmed_charge_is_charged_once_and_not_asked_again(connect: Connect) -> None:
    user = User("accept", confirm=True)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with connect(elicitation_callback=user) as client:
            first = await client.call_tool("charge_card", dict(LARGE))
            again = await client.call_tool("charge_card", dict(LARGE))
            made = await charges(client)

    assert not first.is_error, text(first)
    assert op(first)["state"] == "executed"
    assert first.structured_content["amount_cents"] == LARGE["amount_cents"]
    # The repeat gets the stored receipt: the user is not asked again.
    assert op(again)["replayed"] is True
    assert again.structured_content == first.structured_content
    assert len(user.asked) == 1
    assert made == 1


@pytest.mark.parametrize("answer", [("decline", None), ("cancel", None), ("accept", False)])
async def test_a_decline_charges_nothing_and_the_next_call_asks_again(connect: Connect, answer: tuple[str, bool | None]) -> None:
    user = User(*answer)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with connect(elicitation_callback=user) as client:
            declined = await client.call_tool("charge_card", dict(LARGE))
            again = await client.call_tool("charge_card", dict(LARGE))
            made = await charges(client)

    for result in (declined, again):
        assert result.is_error, text(result)
        assert op(result)["state"] == "rejected"
        assert "nothing was charged" in text(result)
    assert len(user.asked) == 2, "a decline ran nothing, so the next call asked again"
    assert made == 0


async def test_rounds_driven_by_hand_repeated_reissued_and_tampered(connect: Connect) -> None:
    accept = {"confirm": {"action": "accept", "content": {"confirm": True}}}
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with connect() as client:
            asked = await client.session.call_tool("charge_card", dict(LARGE), allow_input_required=True)
            assert isinstance(asked, InputRequiredResult), asked
            assert asked.request_state
            assert "confirm" in (asked.input_requests or {})
            assert await charges(client) == 0

            state = asked.request_state
            flipped = state[:-1] + ("A" if state[-1] != "A" else "B")
            tampered = await client.session.call_tool(
                "charge_card", dict(LARGE), input_responses=accept, request_state=flipped, allow_input_required=True
            )
            moved = await client.session.call_tool(
                "charge_card",
                {**LARGE, "amount_cents": LARGE["amount_cents"] + 1},
                input_responses=accept,
                request_state=state,
                allow_input_required=True,
            )
            assert await charges(client) == 0

            done = await client.session.call_tool(
                "charge_card", dict(LARGE), input_responses=accept, request_state=state, allow_input_required=True
            )
            repeat = await client.session.call_tool(
                "charge_card", dict(LARGE), input_responses=accept, request_state=state, allow_input_required=True
            )
            reissue = await client.session.call_tool("charge_card", dict(LARGE), allow_input_required=True)
            made = await charges(client)

    for refused in (tampered, moved):
        assert isinstance(refused, CallToolResult), refused
        assert refused.is_error
        assert op(refused)["state"] == "refused"
        assert "nothing ran" in text(refused)
    assert isinstance(done, CallToolResult) and not done.is_error, done
    assert op(done)["state"] == "executed"
    for replay in (repeat, reissue):
        assert isinstance(replay, CallToolResult), replay
        assert op(replay)["replayed"] is True
        assert op(replay)["reference"] == op(done)["reference"]
        assert replay.structured_content == done.structured_content
    assert made == 1


async def test_an_older_protocol_is_refused_when_the_tool_asks(stdio_server: StdioServer) -> None:
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with stdio_server.client("--store", "memory", mode="legacy") as client:
            refused = await client.call_tool("charge_card", dict(LARGE))
            small = await client.call_tool("charge_card", {**LARGE, "amount_cents": 1250})
            made = await charges(client)

    assert refused.is_error
    assert op(refused)["state"] == "refused"
    assert "2026-07-28" in text(refused) and "Nothing ran" in text(refused)
    assert op(small)["state"] == "executed"
    assert made == 1


async def test_the_nickname_tool_is_idempotent_by_construction(connect: Connect) -> None:
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with connect() as client:
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            results = [
                await client.call_tool("set_card_nickname", {"card": "4242", "nickname": "travel"}) for _ in range(2)
            ]

    tool = tools["set_card_nickname"]
    assert tool.annotations is not None and tool.annotations.idempotent_hint is True
    assert tool.meta["idem/idempotent"] == {
        "byConstruction": "sets the card's nickname to the given value; a repeat writes the same value"
    }
    for result in results:
        assert not result.is_error, text(result)
        assert text(result) == 'Card 4242 is now called "travel".'
        # Nothing recorded: no operation in the answer.
        assert not (result.meta or {}).get(META_KEY)


async def test_another_callers_request_state_is_refused(http_server: Callable[..., HttpServer]) -> None:
    server = http_server({"tok-acme": "acme/alice", "tok-globex": "globex/bob"}, "--store", "memory")
    accept = {"confirm": {"action": "accept", "content": {"confirm": True}}}
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with server.client("tok-acme") as alice, server.client("tok-globex") as bob:
            asked = await alice.session.call_tool("charge_card", dict(LARGE), allow_input_required=True)
            assert isinstance(asked, InputRequiredResult), asked
            borrowed = await bob.session.call_tool(
                "charge_card",
                dict(LARGE),
                input_responses=accept,
                request_state=asked.request_state,
                allow_input_required=True,
            )
            before = await charges(alice)
            own = await alice.session.call_tool(
                "charge_card",
                dict(LARGE),
                input_responses=accept,
                request_state=asked.request_state,
                allow_input_required=True,
            )
            after = await charges(alice)

    assert isinstance(borrowed, CallToolResult) and borrowed.is_error, borrowed
    assert op(borrowed)["state"] == "refused"
    assert before == 0
    assert isinstance(own, CallToolResult) and op(own)["state"] == "executed", own
    assert after == 1
