"""What a llama-server router says of the model a request names, read for the `/slots` probe:
whether the model is loading, asleep, or not loaded while the router runs another model's work
(`/models`, and the answers a router gives a request that must not load a model).

Pure and lenient, as the probe's reading is: an answer it cannot read is `UNAVAILABLE`.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

from domain.errors import HttpError
from ports.slot_probe import SlotState

__all__ = ["model_state", "refused_state"]

# A router's child that is starting (a load's first ~0.1 s) is answered for by the router with
# a 500 whose plain-text body opens with this.
_PROXY_STARTING: Final = b"proxy error"
_MODEL_STATES: Final = {
    "loading": SlotState.LOADING,
    "loaded": SlotState.LOADING,  # loaded since the probe's 400: its next poll reads the slot
    "sleeping": SlotState.ASLEEP,
    "unloaded": SlotState.BEHIND,
}


def refused_state(error: HttpError) -> SlotState:
    """The probe's reading of a `/slots` answer that is not 200: the model is loading (503, or
    a router's child starting), or the server cannot say (`UNAVAILABLE`). A router's "not
    loaded" (`ModelNotLoaded`) is read from `/models` instead (`model_state`)."""
    if error.status == 503 or (error.status == 500 and error.body.encode().startswith(_PROXY_STARTING)):
        return SlotState.LOADING
    return SlotState.UNAVAILABLE


def model_state(raw: bytes, model: str) -> SlotState:
    """What a router's `/models` says of `model` (its id or one of its aliases), read leniently:
    `LOADING`, `ASLEEP`, or `BEHIND` when it is not loaded (the router holds a request for it
    behind another model's work, or is about to load it); `UNAVAILABLE` when it cannot say."""
    try:
        listing: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return SlotState.UNAVAILABLE
    models = listing.get("data") if type(listing) is dict else None
    for entry in models if type(models) is list else ():
        if type(entry) is not dict:
            continue
        aliases = entry.get("aliases")
        if entry.get("id") != model and not (type(aliases) is list and model in aliases):
            continue
        status = entry.get("status")
        value = status.get("value") if type(status) is dict else status
        return _MODEL_STATES.get(value, SlotState.UNAVAILABLE) if type(value) is str else SlotState.UNAVAILABLE
    return SlotState.UNAVAILABLE
