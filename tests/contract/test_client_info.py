"""`props`, `slots` and `tokenize` against the fake server: typed results from the answers recorded
from the real llama-server, and the same error mapping as a chat (a non-200 answer is its
`HttpError`, a missing socket is `ConnectError`, silence is `Stalled`, anything malformed or over
a cap is `ProtocolError`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

import pytest

from adapters.fake_server import (
    End,
    FakeServer,
    Piece,
    Raw,
    Reply,
    error_reply,
    json_reply,
    loading,
    raw_reply,
    silence,
    slots_reply,
)
from app.client import Client, Props, SlotInfo, Token
from app.config import parse_config
from app.container import Container
from client_support import NO_PROXY_LIMIT, Kind
from domain.errors import ConnectError, HttpError, ProtocolError, Stalled, StreamClosedEarly
from transcripts import TRANSCRIPTS, case_names, load_case

pytestmark = [pytest.mark.timeout(10), pytest.mark.usefixtures("client_kind")]

LIMITS = {"poll_ms": 50, "load_wait_ms": 150, "liveness_ms": 100}
TEMPLATE = "{%- for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}"
PROPS = {
    "default_generation_settings": {"n_ctx": 4096, "params": {"top_k": 40}},
    "total_slots": 2,
    "model_alias": "test-model",
    "model_path": "/models/SmolLM2-135M-Instruct.Q4_1.gguf",
    "chat_template": TEMPLATE,
    "build_info": "b0-unknown",
    "is_sleeping": False,
}


def client_for(kind: Kind, socket_path: str, **limits: int) -> Client:
    config = parse_config({"socket": socket_path, "limits": {**LIMITS, **limits}, "proxy": NO_PROXY_LIMIT})
    return kind.client_of(Container(config=config))


def recorded(name: str) -> Any:
    if not (TRANSCRIPTS / "index.json").exists() or name not in case_names():
        pytest.skip(f"transcript {name!r} not recorded (run `make transcripts`)")
    return load_case(name)


# -- typed results ----------------------------------------------------------------------------------


def test_props_gives_the_template_its_sha256_the_slot_count_and_the_slot_context(
    server: FakeServer, client_kind: Kind
) -> None:
    server.route("GET", "/props", json_reply(PROPS))

    props = client_for(client_kind, server.socket_path).props()

    assert props == Props(
        chat_template=TEMPLATE,
        chat_template_sha256=hashlib.sha256(TEMPLATE.encode()).hexdigest(),
        total_slots=2,
        n_ctx=4096,
        model_alias="test-model",
        model_path="/models/SmolLM2-135M-Instruct.Q4_1.gguf",
    )
    (request,) = server.requests
    assert (request.method, request.target, request.body) == ("GET", "/props?model=default&autoload=false", b"")


def test_info_calls_name_the_model_so_a_router_routes_them(server: FakeServer, client_kind: Kind) -> None:
    # A router routes a GET by `?model=` and a POST by the body's `model`; a single-model server
    # ignores both. The /slots poll of a chat names it too.
    server.route("GET", "/props", json_reply(PROPS))
    server.route("GET", "/slots", slots_reply([False, False]))
    server.route("POST", "/tokenize", json_reply({"tokens": []}))
    config = parse_config({"socket": server.socket_path, "model": "org/Qwen3 0.6B", "limits": LIMITS})
    container = Container(config=config)
    client = client_kind.client_of(container)

    client.props()
    client.slots()
    client.tokenize("")
    client_kind.probe_state(container, 0)

    # None of them may load the model on a router (`autoload=false`): that could evict another's.
    assert [r.target for r in server.requests] == [
        "/props?model=org%2FQwen3%200.6B&autoload=false",
        "/slots?model=org%2FQwen3%200.6B&autoload=false",
        "/tokenize?autoload=false",
        "/slots?model=org%2FQwen3%200.6B&autoload=false",
    ]
    assert server.requests[2].json() == {"content": "", "with_pieces": True, "model": "org/Qwen3 0.6B"}


@pytest.mark.parametrize("name", ["props", "props_thinking"])
def test_props_of_the_recorded_servers(name: str, client_kind: Kind) -> None:
    case = recorded(name)
    answer = json.loads(case.body)
    with FakeServer({("GET", "/props"): raw_reply(case.response_raw)}) as server:
        props = client_for(client_kind, server.socket_path).props()

    assert props.chat_template == answer["chat_template"]
    assert props.chat_template_sha256 == hashlib.sha256(answer["chat_template"].encode()).hexdigest()
    assert (props.total_slots, props.n_ctx) == (2, 4096)
    assert props.model_alias == answer.get("model_alias")


def test_slots_gives_each_slot_busy_or_idle(server: FakeServer, client_kind: Kind) -> None:
    server.route("GET", "/slots", slots_reply([True, False], n_ctx=4096))

    assert client_for(client_kind, server.socket_path).slots() == [SlotInfo(0, True, 4096), SlotInfo(1, False, 4096)]


@pytest.mark.parametrize(("name", "busy"), [("slots", [False, False]), ("slots_busy", None)])
def test_slots_of_the_recorded_server(name: str, busy: list[bool] | None, client_kind: Kind) -> None:
    case = recorded(name)
    answer = json.loads(case.body)
    with FakeServer({("GET", "/slots"): raw_reply(case.response_raw)}) as server:
        slots = client_for(client_kind, server.socket_path).slots()

    assert slots == [SlotInfo(s["id"], s["is_processing"], s["n_ctx"]) for s in answer]
    if busy is not None:
        assert [s.is_processing for s in slots] == busy
    else:
        assert any(s.is_processing for s in slots), "recorded while a stream ran"


def test_tokenize_sends_the_text_with_pieces_and_gives_ids_and_pieces(server: FakeServer, client_kind: Kind) -> None:
    answer = {"tokens": [{"id": 19556, "piece": "Hello"}, {"id": 28, "piece": ","}]}
    server.route("POST", "/tokenize", json_reply(answer))

    tokens = client_for(client_kind, server.socket_path).tokenize("Hello,")

    assert tokens == [Token(19556, "Hello", b"Hello"), Token(28, ",", b",")]
    (request,) = server.requests
    assert request.json() == {"content": "Hello,", "with_pieces": True, "model": "default"}


def test_tokenize_keeps_the_exact_bytes_of_pieces_that_split_a_character(client_kind: Kind) -> None:
    # llama-server sends such a piece as a list of byte values.
    case = recorded("tokenize")
    text = json.loads(case.request)["content"]
    answer = json.loads(case.body)["tokens"]
    with FakeServer({("POST", "/tokenize"): raw_reply(case.response_raw)}) as server:
        tokens = client_for(client_kind, server.socket_path).tokenize(text)
        sent = server.requests[0].body

    assert json.loads(sent) == {**json.loads(case.request), "model": "default"}
    assert [t.id for t in tokens] == [t["id"] for t in answer]
    assert b"".join(t.data for t in tokens) == text.encode()
    split = [t for t, raw in zip(tokens, answer, strict=True) if isinstance(raw["piece"], list)]
    assert split, "the recorded text has characters split between tokens"
    assert all(
        t.data == bytes(raw["piece"]) for t, raw in zip(tokens, answer, strict=True) if isinstance(raw["piece"], list)
    )
    assert tokens[0] == Token(19556, "Hello", b"Hello")


# -- error mapping ----------------------------------------------------------------------------------

Call = Callable[[Client], object]
CALLS: dict[str, tuple[str, str, Call]] = {
    "props": ("GET", "/props", lambda c: c.props()),
    "slots": ("GET", "/slots", lambda c: c.slots()),
    "tokenize": ("POST", "/tokenize", lambda c: c.tokenize("Hello")),
}


@pytest.fixture(params=sorted(CALLS))
def call(request: pytest.FixtureRequest) -> tuple[str, str, Call]:
    return CALLS[request.param]


def test_a_loading_server_is_http_503_with_its_body(
    server: FakeServer, call: tuple[str, str, Call], client_kind: Kind
) -> None:
    method, path, run = call
    server.route(method, path, loading())

    with pytest.raises(HttpError) as caught:
        run(client_for(client_kind, server.socket_path))

    assert caught.value.status == 503
    assert caught.value.body == '{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}'


def test_slots_disabled_is_http_501(server: FakeServer, client_kind: Kind) -> None:
    disabled = error_reply(501, "This server does not support slots endpoint.", "not_supported_error")
    server.route("GET", "/slots", disabled)

    with pytest.raises(HttpError) as caught:
        client_for(client_kind, server.socket_path).slots()

    assert caught.value.status == 501


def test_a_missing_socket_is_connect_error(tmp_path: Any, call: tuple[str, str, Call], client_kind: Kind) -> None:
    with pytest.raises(ConnectError, match="no such socket file"):
        call[2](client_for(client_kind, str(tmp_path / "missing.sock")))


def test_no_answer_within_the_load_wait_is_stalled(
    server: FakeServer, call: tuple[str, str, Call], client_kind: Kind
) -> None:
    method, path, run = call
    server.route(method, path, silence())

    with pytest.raises(Stalled, match=f"{method} {path}\\?(model=default&)?autoload=false: no answer within 150 ms"):
        run(client_for(client_kind, server.socket_path))

    assert server.requests[0].client_closed.wait(2.0)


def test_a_body_cut_short_is_stream_closed_early(
    server: FakeServer, call: tuple[str, str, Call], client_kind: Kind
) -> None:
    method, path, run = call
    server.route(method, path, Reply(200, (("Content-Length", "100"),), [Piece(0.0, b'{"tokens": [')], end=End.RESET))

    with pytest.raises(StreamClosedEarly):
        run(client_for(client_kind, server.socket_path))


@pytest.mark.parametrize(
    ("path", "answer", "message"),
    [
        ("/props", b"<html>not json</html>", "/props: answer is not valid JSON"),
        ("/props", b'{"total_slots": 2}', r"/props\.chat_template is missing, not a string"),
        (
            "/props",
            b'{"chat_template": "x", "total_slots": "2", "default_generation_settings": {"n_ctx": 1}}',
            r"/props\.total_slots is '2', not a positive integer",
        ),
        ("/slots", b'{"slots": []}', r"/slots is \{'slots': \[\]\}, not a list"),
        ("/slots", b'[{"id": "0", "is_processing": false}]', r"/slots\[0\]\.id is '0', not a non-negative integer"),
        ("/slots", b'[{"id": 0}]', r"/slots\[0\]\.is_processing is None, not a boolean"),
        ("/tokenize", b"[1, 2, 3]", r"/tokenize is \[1, 2, 3\], not an object"),
        ("/tokenize", b'{"tokens": [19556, 28]}', r"/tokenize\.tokens\[0\] is 19556, not an object"),
        ("/tokenize", b'{"tokens": [{"id": 1, "piece": [300]}]}', r"tokens\[0\]\.piece is \[300\], neither text nor"),
        # One parser, one set of rules, whatever the endpoint: nesting, surrogates, exact types.
        ("/props", b"[" * 100_000 + b"]" * 100_000, "/props: answer is not valid JSON"),
        (
            "/props",
            b'{"chat_template": "\\ud800", "total_slots": 1, "default_generation_settings": {"n_ctx": 1}}',
            "/props: answer is not valid JSON",
        ),
        (
            "/props",
            b'{"chat_template": "x", "total_slots": true, "default_generation_settings": {"n_ctx": 1}}',
            r"/props\.total_slots is True, not a positive integer",
        ),
        (
            "/props",
            b'{"chat_template": "x", "total_slots": 1, "default_generation_settings": {"n_ctx": 1.0}}',
            r"/props\.default_generation_settings\.n_ctx is 1\.0, not a positive integer",
        ),
        (
            "/props",
            b'{"chat_template": "x", "total_slots": 1}',
            r"/props\.default_generation_settings is None, not an object",
        ),
        ("/slots", b"[" * 100_000 + b"]" * 100_000, "/slots: answer is not valid JSON"),
        ("/slots", b'[{"id": true, "is_processing": false}]', r"/slots\[0\]\.id is True"),
        ("/slots", b'[{"id": 0, "is_processing": 0}]', r"/slots\[0\]\.is_processing is 0, not a boolean"),
        ("/tokenize", b'{"tokens": [{"id": false, "piece": "a"}]}', r"/tokenize\.tokens\[0\]\.id is False"),
        ("/tokenize", b'{"tokens": [{"id": 1, "piece": [true]}]}', r"tokens\[0\]\.piece is \[True\]"),
        ("/tokenize", b'{"tokens": [{"id": 1, "piece": "\\udfff"}]}', "/tokenize: answer is not valid JSON"),
    ],
)
def test_malformed_answers_are_protocol_errors(
    server: FakeServer, path: str, answer: bytes, message: str, client_kind: Kind
) -> None:
    method, _, run = next(c for c in CALLS.values() if c[1] == path)
    server.route(method, path, Reply(200, (("Content-Type", "application/json"),), [Piece(0.0, answer)]))

    with pytest.raises(ProtocolError, match=message):
        run(client_for(client_kind, server.socket_path))


def test_a_body_over_its_cap_is_a_protocol_error(
    server: FakeServer, call: tuple[str, str, Call], client_kind: Kind
) -> None:
    method, path, run = call
    big = {**PROPS, "chat_template": "x" * 70_000}
    server.route(method, path, json_reply(big))

    with pytest.raises(ProtocolError, match="65536-byte body limit"):
        run(client_for(client_kind, server.socket_path, body_bytes=65536))


def test_a_read_to_close_body_over_its_cap_is_a_protocol_error(server: FakeServer, client_kind: Kind) -> None:
    # No Content-Length: the cap is found while reading, not from the head.
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
    server.route("GET", "/props", Raw([Piece(0.0, head), *[Piece(0.0, b" " * 1024)] * 70]))

    with pytest.raises(ProtocolError, match="body over the 65536-byte limit"):
        client_for(client_kind, server.socket_path, body_bytes=65536).props()
