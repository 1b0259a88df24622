"""What a llama-server router says of the model a request names, read for the `/slots` probe:
whether the model is loading, asleep, or not loaded while the router runs another model's work
(`/models`, and the answers a router gives a request that must not load a model).

Pure and lenient, as the probe's reading is: an answer it cannot read is `UNAVAILABLE`.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

from domain.errors import HttpError, InferError, StreamClosedEarly
from ports.slot_probe import SlotState

__all__ = ["model_state", "model_status", "refused_state", "unloaded_cut"]

# A router's child that is starting (a load's first ~0.1 s) is answered for by the router with
# a 500 whose plain-text body opens with this.
_PROXY_STARTING: Final = b"proxy error"
_MODEL_STATES: Final = {
    "loading": SlotState.LOADING,
    "loaded": SlotState.LOADING,  # loaded since the probe's 400: its next poll reads the slot
    "sleeping": SlotState.ASLEEP,
    "unloaded": SlotState.BEHIND,
}
# What the probe reads of a model a router no longer runs, said in the cut it caused.
_GONE: Final = {"loading": "loading again", "sleeping": "asleep", "unloaded": "not loaded"}


def refused_state(error: HttpError) -> SlotState:
    """The probe's reading of a `/slots` answer that is not 200: the model is loading (503, or
    a router's child starting), or the server cannot say (`UNAVAILABLE`). A router's "not
    loaded" (`ModelNotLoaded`) is read from `/models` instead (`model_state`)."""
    if error.status == 503 or (
        error.status == 500 and error.body.encode().startswith(_PROXY_STARTING)
    ):
        return SlotState.LOADING
    return SlotState.UNAVAILABLE


def model_state(raw: bytes, model: str) -> SlotState:
    """What a router's `/models` says of `model` (its id or one of its aliases), read leniently:
    `LOADING`, `ASLEEP`, or `BEHIND` when it is not loaded (the router holds a request for it
    behind another model's work, or is about to load it); `UNAVAILABLE` when it cannot say."""
    status = model_status(raw, model)
    return (
        SlotState.UNAVAILABLE
        if status is None
        else _MODEL_STATES.get(status, SlotState.UNAVAILABLE)
    )


def model_status(raw: bytes, model: str) -> str | None:
    """The status a router's `/models` gives `model` (its id or one of its aliases): `loaded`,
    `loading`, `unloaded`, `sleeping`, ...; None when the answer does not say (a single-model
    server's `/models` has no status)."""
    try:
        listing: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    models = listing.get("data") if type(listing) is dict else None
    for entry in models if type(models) is list else ():
        if type(entry) is not dict:
            continue
        aliases = entry.get("aliases")
        if entry.get("id") != model and not (type(aliases) is list and model in aliases):
            continue
        status = entry.get("status")
        value = status.get("value") if type(status) is dict else status
        return value if type(value) is str else None
    return None


def unloaded_cut(cut: InferError, status: str | None) -> InferError:
    """The break a refused re-attach would have mended, named for what it was when the router's
    `/models`, asked after the refusal, says it no longer runs the model (`status`, from
    `model_status`): an unload or a swap under `--models-max` stopped the model's server
    mid-answer, and the answer's replay went with it. Any other status leaves `cut` as it is."""
    now = None if status is None else _GONE.get(status)
    if now is None:
        return cut
    return StreamClosedEarly(
        f"{cut}; the router unloaded the model mid-answer (another model swapped in, or an unload"
        f" or idle sleep; it is {now} now), and the answer's stream went with it"
    )
