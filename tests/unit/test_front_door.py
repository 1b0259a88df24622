"""`inferpath` is the one front door: every public name of the home modules, the same objects,
listed in `__all__`, and every event and error among them."""

from __future__ import annotations

import inspect
import sys
import typing

import inferpath
from app import async_client, client
from domain import errors, events, messages, openai_form


def test_every_name_in_all_is_importable_and_is_its_home_modules_object() -> None:
    for name in inferpath.__all__:
        exported = getattr(inferpath, name)
        home = sys.modules.get(getattr(exported, "__module__", ""), None)
        if home is not None and hasattr(home, name):
            assert getattr(home, name) is exported, f"inferpath.{name} is not {home.__name__}.{name}"
    assert inferpath.Sampling is messages.Sampling and inferpath.ChatEvent is events.ChatEvent
    assert len(set(inferpath.__all__)) == len(inferpath.__all__)


def test_every_error_class_is_exported() -> None:
    raised = {
        name
        for name, obj in vars(errors).items()
        if inspect.isclass(obj) and issubclass(obj, errors.InferError) and not name.startswith("_")
    }
    assert raised <= set(inferpath.__all__), raised - set(inferpath.__all__)


def test_every_event_of_the_chat_event_union_is_exported() -> None:
    kinds = {kind.__name__ for kind in typing.get_args(events.ChatEvent)}
    assert kinds, "ChatEvent is a union of event classes"
    assert kinds <= set(inferpath.__all__), kinds - set(inferpath.__all__)


def test_the_front_door_names_the_brief_asks_for() -> None:
    wanted = {
        *("Client", "AsyncClient", "Container", "load_config", "parse_config", "ChatRequest", "SystemMessage"),
        *("UserMessage", "AssistantMessage", "ToolMessage", "ToolSchema", "Completion", "FinishReason"),
        "CancelToken",
    }
    assert wanted <= set(inferpath.__all__)
    assert inferpath.Client is client.Client and inferpath.AsyncClient is async_client.AsyncClient


def test_the_conversion_to_and_from_openai_style_dicts_is_exported() -> None:
    for name in ("to_openai", "from_openai", "tools_to_openai", "tools_from_openai"):
        assert name in inferpath.__all__
        assert getattr(inferpath, name) is getattr(openai_form, name)
