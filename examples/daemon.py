"""A small daemon on the library: four sessions on a server of two slots, each a conversation
of three turns with a tool, retried; three sessions on one asyncio loop, one in a thread with the
blocking client; the blocking session's last turn cancelled mid-answer, as a user's Stop would.

    python examples/daemon.py [CONFIG]     # default .run/config.toml, as `make serve` writes it

Run it against `make serve`. It prints each session's answers and exits 0 once every session
ended as it should. Everything here is the daemon's own logic: no glue around the library.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from dataclasses import replace

from inferpath import (
    AsyncClient,
    Cancelled,
    CancelToken,
    ChatEvent,
    ChatMessage,
    ChatRequest,
    Client,
    Completion,
    Container,
    Content,
    SystemMessage,
    ToolCall,
    ToolMessage,
    ToolSchema,
    UserMessage,
    load_config,
)

GET_TIME = ToolSchema(
    name="get_time",
    description="Get the current local time in a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
CITIES = ["Paris", "Lima", "Oslo", "Cairo"]
RULES = SystemMessage("You are a terse assistant. Answer in one short sentence.")


def run_tool(call: ToolCall) -> ToolMessage:
    """The daemon's tool: its result goes back as the answer to the call."""
    city = json.loads(call.arguments).get("city", "somewhere")
    return ToolMessage.answering(call, f"It is 10:30 in {city}.")


def after(history: list[ChatMessage], completion: Completion) -> list[ChatMessage]:
    """The history for the next request: the answer as it came, then each tool call's result."""
    return [*history, completion.message(), *(run_tool(call) for call in completion.tool_calls)]


def asking(session: int, prefill: str | None) -> ChatRequest:
    # The small model calls a tool only when the call's opening is handed to it (`prefill`).
    ask = UserMessage(f"What time is it in {CITIES[session]}? Call the get_time tool.")
    return ChatRequest(slot=session % 2, messages=[RULES, ask], tools=[GET_TIME], prefill=prefill, max_tokens=64)


def follow_up(session: int, history: list[ChatMessage], say: str | None = None) -> ChatRequest:
    """The next turn: the model reads the tool's result, or the user says `say`."""
    messages = history if say is None else [*history, UserMessage(say)]
    return ChatRequest(slot=session % 2, messages=messages, max_tokens=48)


async def async_session(client: AsyncClient, session: int, prefill: str | None) -> None:
    req = asking(session, prefill)
    history = after(list(req.messages), await client.chat_with_retry(req))
    for say in (None, "Thank you."):
        completion = await client.chat_with_retry(follow_up(session, history, say))
        history = after(history, completion)
        print(f"session {session}: {completion.content!r}", flush=True)


def blocking_session(client: Client, session: int, prefill: str | None, outcome: list[str]) -> None:
    req = asking(session, prefill)
    history = after(list(req.messages), client.chat_with_retry(req))
    completion = client.chat_with_retry(follow_up(session, history))
    history = after(history, completion)
    print(f"session {session}: {completion.content!r}", flush=True)
    token = CancelToken()  # the last turn: a long answer the user stops at its first word

    def stop_at_first_word(event: ChatEvent) -> None:
        if isinstance(event, Content):
            token.cancel()

    story = follow_up(session, history, "Tell me a long story.")
    try:
        client.chat_with_retry(replace(story, max_tokens=400), stop_at_first_word, cancel=token)
        outcome.append("not cancelled")
    except Cancelled as stopped:
        print(f"session {session}: stopped after {stopped.content!r}", flush=True)
        outcome.append("cancelled")


async def main(path: str) -> int:
    config = load_config(path)
    prefill = config.selftest.tool_prefill or None
    container = Container(config=config)
    outcome: list[str] = []
    with container.client() as client:
        worker = threading.Thread(target=blocking_session, args=(client, 3, prefill, outcome))
        worker.start()
        async with container.async_client() as aclient:
            await asyncio.gather(*(async_session(aclient, n, prefill) for n in range(3)))
        await asyncio.to_thread(worker.join)
    return 0 if outcome == ["cancelled"] else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else ".run/config.toml")))
