"""The error tree drawn in `domain.errors`' docstring is the classes' own: every class in it,
under its base, and the retry column is what `chat_with_retry` does (`InferError.retried`)."""

from __future__ import annotations

import inspect
import re

import pytest

from domain import errors
from domain.errors import HttpError, InferError, ModelNotLoaded
from domain.retry import is_retryable

TREE = re.compile(r"^    (?P<indent>[│ ]*(?:[├└]── )?)(?P<name>[A-Z]\w+)\s+(?P<text>.*)$")


def drawn() -> dict[str, tuple[str | None, str]]:
    """Each class the docstring draws: its parent in the drawing and the line's text."""
    assert errors.__doc__ is not None
    found: dict[str, tuple[str | None, str]] = {}
    stack: list[tuple[int, str]] = []
    for line in errors.__doc__.splitlines():
        match = TREE.match(line)
        if match is None:
            continue
        depth = len(match["indent"]) // 4
        while stack and stack[-1][0] >= depth:
            stack.pop()
        found[match["name"]] = (stack[-1][1] if stack else None, match["text"])
        stack.append((depth, match["name"]))
    return found


def classes() -> dict[str, type[InferError]]:
    return {
        name: obj
        for name, obj in vars(errors).items()
        if inspect.isclass(obj) and issubclass(obj, InferError) and not name.startswith("_")
    }


def test_the_drawing_names_every_error_class_under_its_base() -> None:
    tree = drawn()
    assert set(tree) == set(classes()), set(tree) ^ set(classes())
    for name, (parent, _) in tree.items():
        cls = classes()[name]
        if parent is None:
            assert cls is InferError
        else:
            assert cls.__bases__[0] is classes()[parent], f"{name} is drawn under {parent}"


def example(cls: type[InferError]) -> InferError:
    if issubclass(cls, HttpError):
        return cls(400, "bad")
    if cls is errors.Busy:
        return errors.Busy(0, 8)
    return cls("x")


@pytest.mark.parametrize("name", sorted(classes()))
def test_the_drawings_retry_column_is_what_chat_with_retry_does(name: str) -> None:
    text = drawn()[name][1]
    error = example(classes()[name])
    if text.endswith("not retried"):
        assert not is_retryable(error)
    elif text.endswith("retried"):
        assert is_retryable(error)


def test_an_http_error_is_retried_only_when_it_says_loading() -> None:
    assert is_retryable(HttpError(503, "Loading model"))
    assert not is_retryable(HttpError(500, "x")) and not is_retryable(ModelNotLoaded(400, "model is not loaded"))


@pytest.mark.parametrize("name", sorted(classes()))
def test_every_error_class_says_what_happened_in_its_docstring(name: str) -> None:
    doc = classes()[name].__doc__
    assert doc is not None and len(doc.split()) >= 8, name
