"""The tool calls of one answer, merged by `index` from a stream's deltas (for
`domain.assembler`): `id` and `name` are set by the first delta that carries them (a later
equal value is ignored, a different one is a `ProtocolError`), `arguments` pieces are
concatenated (as UTF-8, in one growing buffer a call), `type` never is. At most `max_calls`
distinct indexes are taken; one more is a `ProtocolError` (an index costs memory even when its
deltas carry no byte of answer)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from domain.errors import ProtocolError, shown
from domain.events import ChatEvent, ToolCallDelta
from domain.messages import ToolCall

__all__ = ["ToolCalls"]


class _Call:
    """One tool call being assembled."""

    __slots__ = ("arguments", "id", "name")

    def __init__(self) -> None:
        self.id: str | None = None
        self.name: str | None = None
        self.arguments = bytearray()  # UTF-8


def _set_once(index: int, field: str, old: str | None, new: object) -> str | None:
    if new is None or new == "":
        return old
    if type(new) is not str:
        raise ProtocolError(f"tool call {index}: {field} is a {type(new).__name__}, not a string")
    if old is not None and old != new:
        raise ProtocolError(
            f"tool call {index} changed its {field} from {shown(old)} to {shown(new)}"
        )
    return new


class ToolCalls:
    """The calls assembled so far; `max_calls` None leaves their number unbounded."""

    __slots__ = ("_calls", "_max")

    def __init__(self, max_calls: int | None = None) -> None:
        self._calls: dict[int, _Call] = {}
        self._max = max_calls

    def feed(
        self, deltas: list[dict[str, Any]], grow: Callable[[str], bytes], chunks: int
    ) -> tuple[bool, list[ChatEvent]]:
        """Merge one chunk's `tool_calls` (chunk number `chunks`): whether they moved the answer
        on (a first name, an arguments piece), and their events. Every new byte of text goes
        through `grow`, which charges it to the answer (and raises past its cap)."""
        out: list[ChatEvent] = []
        grew = False
        for delta in deltas:
            index = delta.get("index")
            if type(index) is not int or index < 0:
                raise ProtocolError(
                    f"tool call delta has index {shown(index)}, not a non-negative integer"
                )
            call = self._calls.get(index)
            if call is None:
                if self._max is not None and len(self._calls) >= self._max:
                    raise ProtocolError(
                        f"the answer grew past the {self._max}-tool-call limit (tool_calls)"
                        f" with index {index} after {chunks} chunks"
                    )
                call = self._calls[index] = _Call()
            function = delta.get("function") or {}
            new_id = delta.get("id")
            name = function.get("name")
            old_id, old_name = call.id, call.name
            call.id = _set_once(index, "id", old_id, new_id)
            call.name = _set_once(index, "name", old_name, name)
            # `_set_once` refused a changed value, so a value is new only where there was none.
            if old_id is None and call.id is not None:
                grow(call.id)
            if old_name is None and call.name is not None:
                grow(call.name)
                grew = True
            arguments = function.get("arguments")
            if arguments is None:
                arguments = ""
            elif type(arguments) is not str:
                raise ProtocolError(f"tool call {index}: arguments is a {type(arguments).__name__}")
            elif arguments:
                call.arguments += grow(arguments)
                grew = True
            out.append(ToolCallDelta(index, new_id or None, name or None, arguments))
        return grew, out

    def result(self) -> tuple[ToolCall, ...]:
        """The calls in index order; `ProtocolError` for one that never named its function."""
        calls = []
        for index in sorted(self._calls):
            call = self._calls[index]
            if call.name is None:
                raise ProtocolError(f"tool call {index} never named its function")
            calls.append(ToolCall(call.id or "", call.name, call.arguments.decode("utf-8")))
        return tuple(calls)
