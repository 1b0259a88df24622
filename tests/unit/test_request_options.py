"""Per-request options: `max_tokens`, `sampling`, `stop` and `response_format` on a `ChatRequest`.

Unset, they leave the body byte for byte as it was before they existed (pinned below by the
SHA-256 of every recorded case's body). Set, each lands in a fixed place: `max_tokens` and the
sampling fields where the config's values go, `stop` and then `response_format` last. Every bad
value is a `RequestError` that names the field.
"""

from __future__ import annotations

import hashlib
import json
from types import MappingProxyType
from typing import Any

import pytest

from domain.messages import ChatRequest, Sampling, ToolSchema, UserMessage
from domain.request import RequestError, RequestSettings, build_chat_body, effective_max_tokens
from domain.request_options import MAX_FORMAT_DEPTH, MAX_STOP
from transcripts import case_params, load_case, request_from

SETTINGS = RequestSettings(
    model="test-model", max_tokens=8192, temperature=0.6, top_p=0.95, top_k=20, min_p=0.0, seed=-1
)
MESSAGES = (UserMessage("hi"),)
TOOL = ToolSchema(name="f", description="d", parameters={"type": "object"})
HEAD = (
    b'{"model":"test-model","messages":[{"role":"user","content":"hi"}],"id_slot":0,"cache_prompt":true,'
    b'"stream":true,"return_progress":true,"timings_per_token":true,"reasoning_control":true,'
    b'"chat_template_kwargs":{"enable_thinking":false},'
)
PLAIN = HEAD + b'"max_tokens":8192,"temperature":0.6,"top_p":0.95,"top_k":20,"min_p":0.0,"seed":-1}'
# Properties deliberately out of alphabetical order: the grammar follows this order, so the
# answer's keys do too.
PERSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
PERSON = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA}}
PERSON_BYTES = (
    b'"response_format":{"type":"json_schema","json_schema":{"name":"person","schema":{"type":"object",'
    b'"properties":{"name":{"type":"string"},"age":{"type":"integer"}},"required":["name","age"]}}}'
)

# SHA-256 of the body each recorded case's inputs rendered to before per-request options existed.
RECORDED_BODIES = {
    "exceed_context": "3c34f4fc7a3b45b4c01eee3f4ff4822cec6e5e440e21f51a805aace97ff5da60",
    "plain_answer": "85da5226cdfe09c00b8cec625db915ba017d1402732608db241af383c55dd1e3",
    "prompt_progress": "719f179372f24f2c4e27242b68810de984e0f63b6cbc71a49e43e67f8c6c4abf",
    "raw_chunked": "72a2412107dadd8d6f3e9fcb6f5806e94c2400660720f1a8307111eb647b3c3e",
    "reasoning_end": "f1559074386febdd3b9d417d0e6e748e98debd59f73d4fb5ced6c180fbfa2c63",
    "thinking_answer": "81e296709542a164c8901d9a8d302c6b6c3191580fe6843e543559e2955278aa",
    "tool_call": "a29d9f3962131aad96dd87b79b0d4263081307ba125116d7e8575c0941a95b3c",
}
CHAT_CASES = case_params(lambda case: case.inputs is not None)


def render(settings: RequestSettings = SETTINGS, **options: Any) -> bytes:
    return build_chat_body(ChatRequest(slot=0, messages=MESSAGES, **options), settings, total_slots=2)


def keys(raw: bytes) -> list[str]:
    return [key for key, _ in json.loads(raw, object_pairs_hook=lambda pairs: pairs)]


def refusal(settings: RequestSettings = SETTINGS, **options: Any) -> str:
    with pytest.raises(RequestError) as caught:
        render(settings, **options)
    return str(caught.value)


# -- unset options change nothing ------------------------------------------------------------


@pytest.mark.parametrize("name", CHAT_CASES)
def test_a_recorded_request_without_options_renders_the_same_bytes_as_before(name: str) -> None:
    case = load_case(name)
    assert case.inputs is not None
    raw = build_chat_body(*request_from(case.inputs), total_slots=2)
    assert hashlib.sha256(raw).hexdigest() == RECORDED_BODIES[name]


def test_every_recorded_case_has_a_pinned_body() -> None:
    assert sorted(RECORDED_BODIES) == sorted(n for n in CHAT_CASES if isinstance(n, str))


def test_the_plain_answer_case_renders_exactly_these_bytes() -> None:
    case = load_case("plain_answer")
    assert case.inputs is not None
    assert build_chat_body(*request_from(case.inputs), total_slots=2) == (
        b'{"model":"test-model","messages":[{"role":"system","content":"You are a helpful assistant."},'
        b'{"role":"user","content":"What is the capital of France? Answer in one short sentence."}],'
        b'"id_slot":0,"cache_prompt":true,"stream":true,"return_progress":true,"timings_per_token":true,'
        b'"reasoning_control":true,"chat_template_kwargs":{"enable_thinking":false},"max_tokens":64,'
        b'"temperature":0.0,"top_p":0.95,"top_k":20,"min_p":0.0,"seed":42}'
    )


def test_options_left_at_their_defaults_render_the_plain_body() -> None:
    assert render() == PLAIN
    assert render(max_tokens=None, sampling=None, stop=(), response_format=None) == PLAIN


def test_a_sampling_with_every_field_unset_keeps_every_config_value() -> None:
    assert render(sampling=Sampling()) == PLAIN


def test_an_empty_stop_list_sends_no_stop_key() -> None:
    assert render(stop=[]) == PLAIN


# -- each option where it belongs ------------------------------------------------------------


def test_max_tokens_takes_the_config_values_place() -> None:
    assert render(max_tokens=5) == PLAIN.replace(b'"max_tokens":8192', b'"max_tokens":5')


@pytest.mark.parametrize(
    ("field", "value", "rendered"),
    [
        ("temperature", 0.0, b'"temperature":0.0'),
        ("temperature", 1.25, b'"temperature":1.25'),
        ("top_p", 0.5, b'"top_p":0.5'),
        ("top_k", 1, b'"top_k":1'),
        ("min_p", 0.05, b'"min_p":0.05'),
        ("seed", 42, b'"seed":42'),
    ],
)
def test_each_sampling_field_replaces_the_config_value_in_place(field: str, value: Any, rendered: bytes) -> None:
    default = {
        "temperature": b'"temperature":0.6',
        "top_p": b'"top_p":0.95',
        "top_k": b'"top_k":20',
        "min_p": b'"min_p":0.0',
        "seed": b'"seed":-1',
    }[field]
    raw = render(sampling=Sampling(**{field: value}))
    assert raw == PLAIN.replace(default, rendered)
    assert json.loads(raw) == {**json.loads(PLAIN), field: value}


def test_every_sampling_field_at_once() -> None:
    raw = render(sampling=Sampling(temperature=0.0, top_p=1.0, top_k=40, min_p=0.1, seed=7))
    assert raw == HEAD + b'"max_tokens":8192,"temperature":0.0,"top_p":1.0,"top_k":40,"min_p":0.1,"seed":7}'


def test_a_sampling_field_the_config_leaves_out_goes_where_it_would_have_been() -> None:
    sparse = RequestSettings(model="test-model", max_tokens=16, temperature=0.6)
    raw = render(sparse, sampling=Sampling(seed=3, top_k=5))
    assert keys(raw)[-4:] == ["max_tokens", "temperature", "top_k", "seed"]
    assert raw.endswith(b'"max_tokens":16,"temperature":0.6,"top_k":5,"seed":3}')


def test_an_integer_for_a_float_field_renders_as_the_config_would_render_it() -> None:
    # The config loads `temperature = 1` as 1.0; an override of 1 renders the same way.
    assert b'"temperature":1.0,' in render(sampling=Sampling(temperature=1))
    assert b'"top_p":1.0,' in render(sampling=Sampling(top_p=1))


def test_stop_comes_after_the_sampling_fields() -> None:
    raw = render(stop=("\n\n", "User:"))
    assert raw == PLAIN[:-1] + b',"stop":["\\n\\n","User:"]}'
    assert keys(raw)[-2:] == ["seed", "stop"]


def test_stop_given_as_a_list_renders_like_a_tuple() -> None:
    assert render(stop=["a", "b"]) == render(stop=("a", "b"))


def test_stop_keeps_non_ascii_text_unescaped() -> None:
    assert render(stop=("ende ☃",)).endswith('"stop":["ende ☃"]}'.encode())


def test_response_format_comes_last_exactly_as_given() -> None:
    raw = render(response_format=PERSON)
    assert raw == PLAIN[:-1] + b"," + PERSON_BYTES + b"}"


def test_response_format_keeps_the_callers_key_order_byte_for_byte() -> None:
    schema = {
        "type": "object",
        "properties": {"zeta": {"type": "string"}, "alpha": {"type": "integer"}, "mid": {"type": "boolean"}},
        "required": ["zeta", "alpha", "mid"],
        "additionalProperties": False,
    }
    fmt = {"json_schema": {"schema": schema, "strict": True, "name": "z"}, "type": "json_schema"}
    raw = render(response_format=fmt)
    assert raw.endswith(
        b'"response_format":{"json_schema":{"schema":{"type":"object","properties":{"zeta":{"type":"string"},'
        b'"alpha":{"type":"integer"},"mid":{"type":"boolean"}},"required":["zeta","alpha","mid"],'
        b'"additionalProperties":false},"strict":true,"name":"z"},"type":"json_schema"}}'
    )
    assert json.loads(raw)["response_format"] == fmt


@pytest.mark.parametrize(
    ("fmt", "rendered"),
    [
        ({"type": "json_object"}, b'{"type":"json_object"}'),
        ({"type": "json_object", "schema": {"type": "array"}}, b'{"type":"json_object","schema":{"type":"array"}}'),
        ({"type": "text"}, b'{"type":"text"}'),
        ({"type": "json_schema", "json_schema": {"schema": {}}}, b'{"type":"json_schema","json_schema":{"schema":{}}}'),
    ],
)
def test_every_response_format_type_the_server_knows_is_sent(fmt: dict[str, Any], rendered: bytes) -> None:
    assert render(response_format=fmt).endswith(b',"response_format":' + rendered + b"}")


def test_a_read_only_mapping_and_tuples_render_like_dicts_and_lists() -> None:
    frozen = MappingProxyType(
        {"type": "json_schema", "json_schema": MappingProxyType({"name": "person", "schema": PERSON_SCHEMA})}
    )
    with_tuple = {"type": "json_object", "schema": {"enum": ("a", "b")}}
    assert render(response_format=frozen) == render(response_format=PERSON)
    assert render(response_format=with_tuple).endswith(b'"schema":{"enum":["a","b"]}}}')


def test_every_option_at_once_in_its_fixed_place() -> None:
    raw = render(
        max_tokens=100,
        sampling=Sampling(temperature=0.0, seed=1),
        stop=("END",),
        response_format={"type": "json_object"},
    )
    assert raw == HEAD + (
        b'"max_tokens":100,"temperature":0.0,"top_p":0.95,"top_k":20,"min_p":0.0,"seed":1,'
        b'"stop":["END"],"response_format":{"type":"json_object"}}'
    )


def test_options_render_the_same_bytes_every_time() -> None:
    options: dict[str, Any] = {
        "max_tokens": 9,
        "sampling": Sampling(top_k=3),
        "stop": ("x",),
        "response_format": PERSON,
    }
    assert render(**options) == render(**options) == render(**{**options, "stop": ["x"]})


def test_response_format_with_tools_and_tool_choice_auto_is_sent() -> None:
    # On templates the server parses itself, the schema then wins and no tool is called: the
    # caller chose that, and "auto" allows an answer without a call.
    raw = render(tools=[TOOL], response_format={"type": "json_object"})
    assert json.loads(raw)["tool_choice"] == "auto"
    assert keys(raw)[-1] == "response_format"


# -- effective_max_tokens: what the client bounds the stream by -------------------------------


def test_effective_max_tokens_is_the_requests_own_when_set() -> None:
    assert effective_max_tokens(ChatRequest(slot=0, messages=MESSAGES, max_tokens=5), SETTINGS) == 5


def test_effective_max_tokens_is_the_configs_when_unset() -> None:
    assert effective_max_tokens(ChatRequest(slot=0, messages=MESSAGES), SETTINGS) == 8192


def test_effective_max_tokens_is_what_the_body_carries() -> None:
    for max_tokens in (None, 1, 77, 2**31 - 1):
        req = ChatRequest(slot=0, messages=MESSAGES, max_tokens=max_tokens)
        body = json.loads(build_chat_body(req, SETTINGS, total_slots=1))
        assert body["max_tokens"] == effective_max_tokens(req, SETTINGS)


def test_effective_max_tokens_refuses_what_the_builder_refuses() -> None:
    with pytest.raises(RequestError, match=r"^max_tokens must be a positive integer up to 2147483647, not 0$"):
        effective_max_tokens(ChatRequest(slot=0, messages=MESSAGES, max_tokens=0), SETTINGS)


# -- refusals, each naming the field ---------------------------------------------------------

TOO_DEEP: dict[str, Any] = {"type": "object"}
for _ in range(MAX_FORMAT_DEPTH):
    TOO_DEEP = {"type": "array", "items": TOO_DEEP}
CYCLE: dict[str, Any] = {"type": "object"}
CYCLE["properties"] = {"self": CYCLE}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_tokens": 0}, "max_tokens must be a positive integer up to 2147483647, not 0"),
        ({"max_tokens": -1}, "max_tokens must be a positive integer up to 2147483647, not -1"),
        ({"max_tokens": 2**31}, "max_tokens must be a positive integer up to 2147483647, not 2147483648"),
        ({"max_tokens": True}, "max_tokens must be a positive integer up to 2147483647, not True"),
        ({"max_tokens": 5.0}, "max_tokens must be a positive integer up to 2147483647, not 5.0"),
        ({"max_tokens": "5"}, "max_tokens must be a positive integer up to 2147483647, not '5'"),
        ({"sampling": {"temperature": 0.1}}, "sampling must be a Sampling, not dict"),
        ({"sampling": Sampling(temperature=-0.1)}, "sampling.temperature must be a finite number from 0 to"),
        ({"sampling": Sampling(temperature=float("nan"))}, "sampling.temperature must be a finite number"),
        ({"sampling": Sampling(temperature=float("inf"))}, "sampling.temperature must be a finite number"),
        (
            {"sampling": Sampling(temperature=3.5e38)},
            "sampling.temperature must be a finite number from 0 to 3.40282e+38",
        ),
        ({"sampling": Sampling(temperature=10**400)}, "sampling.temperature must be a finite number"),
        ({"sampling": Sampling(temperature=True)}, "sampling.temperature must be a number, not bool"),
        ({"sampling": Sampling(temperature="0.5")}, "sampling.temperature must be a number, not str"),
        ({"sampling": Sampling(top_p=1.01)}, "sampling.top_p must be a finite number from 0 to 1, not 1.01"),
        ({"sampling": Sampling(top_p=-0.5)}, "sampling.top_p must be a finite number from 0 to 1, not -0.5"),
        ({"sampling": Sampling(top_p=float("nan"))}, "sampling.top_p must be a finite number from 0 to 1, not nan"),
        ({"sampling": Sampling(min_p=2)}, "sampling.min_p must be a finite number from 0 to 1, not 2"),
        ({"sampling": Sampling(min_p=float("-inf"))}, "sampling.min_p must be a finite number from 0 to 1, not -inf"),
        ({"sampling": Sampling(top_k=-1)}, "sampling.top_k must be from 0 to 2147483647, not -1"),
        ({"sampling": Sampling(top_k=2**31)}, "sampling.top_k must be from 0 to 2147483647, not 2147483648"),
        ({"sampling": Sampling(top_k=4.0)}, "sampling.top_k must be an integer, not float"),
        ({"sampling": Sampling(top_k=True)}, "sampling.top_k must be an integer, not bool"),
        ({"sampling": Sampling(seed=-2)}, "sampling.seed must be from -1 to 4294967295, not -2"),
        ({"sampling": Sampling(seed=2**32)}, "sampling.seed must be from -1 to 4294967295, not 4294967296"),
        ({"sampling": Sampling(seed=False)}, "sampling.seed must be an integer, not bool"),
        ({"stop": "\n"}, "stop must be a tuple or list of strings, not str"),
        ({"stop": {"a"}}, "stop must be a tuple or list of strings, not set"),
        ({"stop": None}, "stop must be a tuple or list of strings, not NoneType"),
        ({"stop": ("x",) * (MAX_STOP + 1)}, f"stop has {MAX_STOP + 1} strings, more than {MAX_STOP}"),
        ({"stop": ("",)}, "stop[0] must be a non-empty string, not ''"),
        ({"stop": ("ok", 3)}, "stop[1] must be a non-empty string, not 3"),
        ({"stop": ("ok", None)}, "stop[1] must be a non-empty string, not None"),
        ({"stop": ("bad \udc80",)}, "stop[0] holds text that is not valid Unicode (surrogates not allowed)"),
        ({"response_format": "json_object"}, "response_format must be a mapping, not str"),
        ({"response_format": {}}, "response_format.type must be one of json_schema, json_object, text, not None"),
        ({"response_format": {"type": 1}}, "response_format.type must be one of json_schema, json_object, text, not 1"),
        (
            {"response_format": {"type": "xml"}},
            "response_format.type must be one of json_schema, json_object, text, not 'xml'",
        ),
        ({"response_format": {"type": "JSON_OBJECT"}}, "response_format.type must be one of"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema must be a mapping, not NoneType"),
        (
            {"response_format": {"type": "json_schema", "schema": PERSON_SCHEMA}},
            "response_format.json_schema must be a mapping, not NoneType",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": PERSON_SCHEMA}},
            "response_format.json_schema.schema must be a JSON Schema object, not nothing",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "p"}}},
            "response_format.json_schema.schema must be a JSON Schema object, not nothing",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": [1]}}},
            "response_format.json_schema.schema must be a JSON Schema object, not list",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": 5, "schema": {}}}},
            "response_format.json_schema.name must be a string, not int",
        ),
        (
            {"response_format": {"type": "json_object", "schema": None}},
            "response_format.schema must be a JSON Schema object, not NoneType",
        ),
        (
            {"response_format": {"type": "json_object", "schema": "{}"}},
            "response_format.schema must be a JSON Schema object, not str",
        ),
        (
            {"response_format": {"type": "json_object", "schema": {"maximum": float("nan")}}},
            "response_format.schema.maximum must be a finite number, not nan",
        ),
        (
            {"response_format": {"type": "json_object", "schema": {"enum": {1, 2}}}},
            "response_format.schema.enum is a set, not a JSON value",
        ),
        (
            {"response_format": {"type": "json_object", "schema": {"properties": {1: {}}}}},
            "response_format.schema.properties has a key that is not a string: 1",
        ),
        (
            {"response_format": {"type": "json_object", "schema": {"const": "\ud800"}}},
            "response_format.schema.const holds text that is not valid Unicode (surrogates not allowed)",
        ),
        (
            {"response_format": {"type": "json_object", "schema": {"\ud800": 1}}},
            "response_format.schema key holds text that is not valid Unicode (surrogates not allowed)",
        ),
        (
            {"response_format": {"type": "json_object", "schema": TOO_DEEP}},
            f"response_format is nested more than {MAX_FORMAT_DEPTH} levels deep (at response_format.schema.items",
        ),
        (
            {"response_format": {"type": "json_object", "schema": CYCLE}},
            f"response_format is nested more than {MAX_FORMAT_DEPTH} levels deep",
        ),
        (
            {"tools": [TOOL], "tool_choice": "required", "response_format": {"type": "json_object"}},
            'response_format cannot be combined with tool_choice "required"',
        ),
    ],
)
def test_a_bad_option_is_refused_naming_the_field(options: dict[str, Any], message: str) -> None:
    assert refusal(**options).startswith(message)


def test_a_deeply_nested_schema_within_the_bound_is_sent() -> None:
    schema: dict[str, Any] = {"type": "string"}
    # response_format, json_schema and the outermost `items` make three levels; the chain below
    # brings the total to exactly MAX_FORMAT_DEPTH.
    for _ in range(MAX_FORMAT_DEPTH - 3):
        schema = {"items": schema}
    fmt = {"type": "json_schema", "json_schema": {"schema": schema}}
    assert json.loads(render(response_format=fmt))["response_format"] == fmt
    with pytest.raises(RequestError, match="nested more than"):
        render(response_format={"type": "json_schema", "json_schema": {"schema": {"items": schema}}})


def test_an_absurdly_deep_schema_is_refused_before_it_can_exhaust_the_stack() -> None:
    schema: dict[str, Any] = {}
    for _ in range(100_000):
        schema = {"not": schema}
    with pytest.raises(RequestError, match=r"^response_format is nested more than"):
        render(response_format={"type": "json_object", "schema": schema})


def test_the_config_max_tokens_is_still_checked_when_the_request_sets_its_own() -> None:
    bad = RequestSettings(model="m", max_tokens=0)
    assert refusal(bad, max_tokens=5).startswith("max_tokens must be a positive integer")


def test_a_refused_option_sends_nothing_even_when_the_rest_is_fine() -> None:
    # The whole body is refused: a request never goes out with an option silently dropped.
    with pytest.raises(RequestError):
        render(max_tokens=5, stop=("",))


def test_a_huge_bad_value_is_quoted_shortened() -> None:
    message = refusal(sampling=Sampling(temperature=10**400))
    assert message.startswith("sampling.temperature must be a finite number from 0 to 3.40282e+38, not 1000")
    assert "..." in message and len(message) < 200


# -- the public shape -------------------------------------------------------------------------


def test_the_options_default_to_nothing_and_sampling_to_all_unset() -> None:
    req = ChatRequest(slot=0, messages=MESSAGES)
    assert (req.max_tokens, req.sampling, req.stop, req.response_format) == (None, None, (), None)
    assert Sampling() == Sampling(temperature=None, top_p=None, top_k=None, min_p=None, seed=None)


def test_sampling_is_frozen() -> None:
    sampling = Sampling(seed=1)
    with pytest.raises(AttributeError):
        sampling.seed = 2  # type: ignore[misc]
