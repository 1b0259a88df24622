"""Per-request options against the real llama-server, through the client and a real `inferproxy`.

- A `response_format` JSON schema holds the small model's answer to the schema, whatever the
  prompt: every answer parses and validates (the rate is printed; run with `-s` to see it).
- A per-request `max_tokens` ends the answer at exactly that many tokens (`finish_reason`
  `length`), below the config's own limit.
- A per-request `stop` string cuts the answer where the same answer without it had that string.
- llama-server's `{"type": "json_object", "schema": ...}` form holds the answer to the schema too.

All on the `tools` preset (the Qwen3 template: no thinking block), slot 0.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import llama
import pytest
from proxy import ProxyProcess

from app.client import Client
from app.config import parse_config
from app.container import Container
from domain.completion import Completion, FinishReason
from domain.events import ChatEvent, Content
from domain.messages import ChatRequest, Sampling, SystemMessage, UserMessage

pytestmark = pytest.mark.device

CONFIG_MAX_TOKENS = 64
SAMPLING = {"temperature": 0.0, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "seed": 42}
PERSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
PERSON = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA}}
# Some prompts ask for a person, some for something else entirely, one for the opposite of JSON:
# the schema, not the prompt, decides the shape of the answer.
PROMPTS = [
    "Invent a person. Give their name and age.",
    "My grandmother Rosa is 82 years old. Who is she?",
    "Who wrote Hamlet?",
    "Describe a cat in one sentence.",
    "Tell me a joke about a lighthouse.",
    "Reply in plain English, never in JSON: what is 2 + 2?",
    "Name a famous scientist and how old they were when they died.",
    "List three colours of the rainbow.",
]


def make_client(socket_path: str) -> Client:
    config = parse_config(
        {
            "socket": socket_path,
            "model": llama.ALIAS,
            "limits": {"max_tokens": CONFIG_MAX_TOKENS, "poll_ms": 200},
            "retry": {"attempts": 1, "delays_ms": []},
            "sampling": SAMPLING,
        }
    )
    client: Client = Container(config=config).client()
    return client


@pytest.fixture
def client(tools_server: llama.LlamaServer) -> Iterator[Client]:
    with ProxyProcess(f"{tools_server.host}:{tools_server.port}") as proxy:
        yield make_client(proxy.socket_path)


def person_errors(text: str | None) -> list[str]:
    """What is wrong with `text` as an instance of `PERSON_SCHEMA`; empty if nothing."""
    try:
        value = json.loads(text or "")
    except ValueError as exc:
        return [f"not JSON: {exc}"]
    if not isinstance(value, dict):
        return [f"not an object: {type(value).__name__}"]
    errors = [f"no {key!r}" for key in PERSON_SCHEMA["required"] if key not in value]
    if "name" in value and not isinstance(value["name"], str):
        errors.append(f"name is {type(value['name']).__name__}, not a string")
    if "age" in value and (not isinstance(value["age"], int) or isinstance(value["age"], bool)):
        errors.append(f"age is {type(value['age']).__name__}, not an integer")
    return errors


def test_the_validator_catches_what_the_schema_forbids() -> None:
    assert person_errors('{"name": "Rosa", "age": 82}') == []
    assert person_errors('{"age": 82, "name": "Rosa", "city": "Oslo"}') == []
    assert person_errors("Rosa, 82") != []
    assert person_errors("[]") == ["not an object: list"]
    assert person_errors('{"name": "Rosa"}') == ["no 'age'"]
    assert person_errors('{"name": 1, "age": 8.5}') == ["name is int, not a string", "age is float, not an integer"]
    assert person_errors('{"name": "R", "age": true}') == ["age is bool, not an integer"]


def ask(client: Client, req: ChatRequest) -> tuple[Completion, list[ChatEvent]]:
    events: list[ChatEvent] = []
    completion = client.chat(req, events.append)
    return completion, events


def test_a_json_schema_holds_every_answer_to_the_schema(client: Client) -> None:
    results = []
    for index, prompt in enumerate(PROMPTS):
        # Half greedy (the config's temperature 0), half sampled with a per-request temperature.
        sampling = None if index % 2 == 0 else Sampling(temperature=0.8, seed=index)
        req = ChatRequest(
            slot=0,
            messages=[SystemMessage("You are a helpful assistant."), UserMessage(prompt)],
            response_format=PERSON,
            sampling=sampling,
            max_tokens=128,
        )
        assert json.loads(client.render(req))["response_format"] == PERSON
        completion, events = ask(client, req)
        assert completion.content == "".join(e.text for e in events if isinstance(e, Content))
        errors = person_errors(completion.content)
        if completion.finish_reason is not FinishReason.STOP:
            errors.append(f"finish_reason {completion.finish_reason.value}")
        results.append((prompt, completion.content, errors))

    valid = sum(1 for _, _, errors in results if not errors)
    report = "\n".join(f"  {'ok  ' if not e else 'FAIL'} {p!r} -> {c!r} {e or ''}" for p, c, e in results)
    print(f"\nschema-constrained answers: {valid} of {len(results)} valid\n{report}")
    assert valid == len(results), f"{valid} of {len(results)} valid:\n{report}"


def test_json_object_with_a_schema_is_held_to_that_schema(client: Client) -> None:
    # llama-server's own shorthand: {"type": "json_object", "schema": ...}.
    req = ChatRequest(
        slot=0,
        messages=[UserMessage("Describe a lighthouse.")],
        response_format={"type": "json_object", "schema": PERSON_SCHEMA},
        max_tokens=128,
    )
    completion, _ = ask(client, req)
    assert completion.finish_reason is FinishReason.STOP, completion
    assert person_errors(completion.content) == [], completion.content


def test_a_per_request_max_tokens_ends_the_answer_at_that_many_tokens(client: Client) -> None:
    req = ChatRequest(slot=0, messages=[UserMessage(llama.LONG_STORY_PROMPT)], max_tokens=5)
    assert json.loads(client.render(req))["max_tokens"] == 5
    completion, events = ask(client, req)
    assert completion.finish_reason is FinishReason.LENGTH
    assert completion.timings.predicted_n == 5
    assert completion.content
    assert completion.content == "".join(e.text for e in events if isinstance(e, Content))


def test_without_a_per_request_max_tokens_the_config_limit_applies(client: Client) -> None:
    req = ChatRequest(slot=0, messages=[UserMessage(llama.LONG_STORY_PROMPT)])
    completion, _ = ask(client, req)
    assert completion.timings.predicted_n <= CONFIG_MAX_TOKENS
    assert completion.timings.predicted_n > 5


def test_a_stop_string_cuts_the_answer_where_it_first_appears(client: Client) -> None:
    messages = [UserMessage("Name three colours of the sea.")]
    full, _ = ask(client, ChatRequest(slot=0, messages=messages, max_tokens=32))
    text = full.content or ""
    words = text.split()
    assert len(words) > 4, text
    stop = words[3]  # early, so the greedy answer is the same up to it
    cut, _ = ask(client, ChatRequest(slot=0, messages=messages, max_tokens=32, stop=(stop,)))
    assert cut.finish_reason is FinishReason.STOP, (text, stop, cut.content)
    assert cut.content == text[: text.index(stop)]
