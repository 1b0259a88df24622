"""What a router says of a model, and what each of its answers costs a waiting request: a load
(or a wake) is charged to `load_wait_ms`, a wait behind another model's work to `busy_wait_ms`."""

from __future__ import annotations

import orjson
import pytest

from domain.errors import HttpError, LoadTimeout, ModelNotLoaded, Stalled, StreamClosedEarly, WaitTimeout, http_error
from domain.events import ModelWait, Waiting
from domain.router_api import model_state, model_status, refused_state, unloaded_cut
from domain.waiting import FirstByteWait
from ports.slot_probe import SlotState


def models(*entries: object) -> bytes:
    return orjson.dumps({"data": list(entries), "object": "list"})


@pytest.mark.parametrize(
    ("status", "state"),
    [
        ("loading", SlotState.LOADING),
        ("loaded", SlotState.LOADING),
        ("sleeping", SlotState.ASLEEP),
        ("unloaded", SlotState.BEHIND),
        ("downloading", SlotState.UNAVAILABLE),
    ],
)
def test_models_says_what_the_router_does_with_the_model(status: str, state: SlotState) -> None:
    other = {"id": "other", "status": {"value": "loaded"}}
    assert model_state(models(other, {"id": "m", "status": {"value": status}}), "m") is state


def test_a_model_named_by_an_alias_is_found_and_anything_unreadable_cannot_say() -> None:
    assert model_state(models({"id": "m", "aliases": ["a"], "status": {"value": "loading"}}), "a") is SlotState.LOADING
    for raw in (b"{", b"[]", models(), models({"id": "m"}), models({"id": "m", "status": 3}), models(None)):
        assert model_state(raw, "m") is SlotState.UNAVAILABLE, raw


def test_only_a_routers_not_loaded_answer_is_model_not_loaded() -> None:
    refused = http_error(400, b'{"error":{"code":400,"message":"model is not loaded"}}', 4096)
    assert isinstance(refused, ModelNotLoaded) and refused.status == 400
    assert type(http_error(400, b'{"error":{"message":"model \'x\' not found"}}', 4096)) is HttpError
    assert type(http_error(500, b"model is not loaded", 4096)) is HttpError


def test_a_503_or_a_starting_child_is_loading_and_other_refusals_cannot_say() -> None:
    assert refused_state(HttpError(503, "Loading model")) is SlotState.LOADING
    assert refused_state(HttpError(500, "proxy error: Could not establish connection")) is SlotState.LOADING
    assert refused_state(HttpError(500, "boom")) is SlotState.UNAVAILABLE
    assert refused_state(HttpError(404, "")) is SlotState.UNAVAILABLE


def wait(**limits: float) -> FirstByteWait:
    values = {"poll_s": 0.1, "busy_wait_s": 1.0, "load_wait_s": 0.3, "idle_grace_s": 0.3, **limits}
    return FirstByteWait(sent_at=0.0, slot=0, **values)


def test_a_wait_behind_another_model_is_charged_to_busy_wait_not_load_wait() -> None:
    first_byte = wait()
    decisions = [first_byte.on_poll(0.1 * n, SlotState.BEHIND) for n in range(1, 10)]
    assert all(d.event == Waiting(slot_busy=False, model=ModelWait.BEHIND) for d in decisions)
    assert not any(d.give_up for d in decisions), "900 ms behind: past load_wait_ms, within busy_wait_ms"
    last = first_byte.on_poll(1.0, SlotState.BEHIND)
    assert isinstance(last.error, WaitTimeout)
    assert "1000 ms of it behind another model" in str(last.error)


@pytest.mark.parametrize(
    ("state", "said"), [(SlotState.LOADING, ModelWait.LOADING), (SlotState.ASLEEP, ModelWait.ASLEEP)]
)
def test_a_load_or_a_wake_is_charged_to_load_wait(state: SlotState, said: ModelWait) -> None:
    first_byte = wait()
    assert first_byte.on_poll(0.1, state) == first_byte.on_poll(0.2, state)
    last = first_byte.on_poll(0.3, state)
    assert last.event == Waiting(slot_busy=False, model=said)
    assert isinstance(last.error, LoadTimeout)
    assert str(last.error).startswith("slot 0: the model was loading for 300 ms, unavailable for 0 ms; limit 300 ms")


def test_a_load_before_sending_is_carried_into_the_wait_for_the_head() -> None:
    # No budget resets another: 250 ms of a load before sending leaves 50 ms of load_wait_ms.
    first_byte = FirstByteWait(
        poll_s=0.1, busy_wait_s=1.0, load_wait_s=0.3, idle_grace_s=0.3, sent_at=0.0, loading_s=0.25
    )
    assert isinstance(first_byte.on_poll(0.1, SlotState.LOADING).error, LoadTimeout)


@pytest.mark.parametrize(
    ("status", "named"),
    [("unloaded", "not loaded now"), ("loading", "loading again now"), ("sleeping", "asleep now")],
)
def test_a_cut_is_named_for_an_unload_when_the_router_no_longer_runs_the_model(status: str, named: str) -> None:
    cut = Stalled("no byte in 30000 ms")
    raw = orjson.dumps(
        {"data": [{"id": "other", "status": {"value": "loaded"}}, {"id": "m", "status": {"value": status}}]}
    )

    named_cut = unloaded_cut(cut, model_status(raw, "m"))

    assert isinstance(named_cut, StreamClosedEarly)
    assert str(named_cut).startswith("no byte in 30000 ms; the router unloaded the model mid-answer")
    assert named in str(named_cut)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"data": [{"id": "m", "status": {"value": "loaded"}}]}',
        b'{"data": [{"id": "m", "object": "model"}]}',  # a single-model server's /models
        b'{"data": [{"id": "other", "status": {"value": "unloaded"}}]}',
        b"not json",
    ],
)
def test_a_cut_is_left_as_it_is_when_the_router_does_not_say_the_model_is_gone(raw: bytes) -> None:
    cut = StreamClosedEarly("closed after chunk 4")

    assert unloaded_cut(cut, model_status(raw, "m")) is cut
