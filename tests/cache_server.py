"""A fake llama-server prompt cache on a `FakeServer`, for the cache prediction and checkpoint tests.

    llama = CachingLlama(server)          # routes /apply-template, /tokenize, /slots, chat, save
    client.chat(req, on_event)            # its timings.cache_n as the cache gives it

It behaves as the real server does where the client depends on it:
- A chat body renders as `<role>content</role>` per message, then `<assistant>` and, when the
  request thinks, `<think>`; an earlier assistant turn is rendered without its reasoning (as the
  Qwen3.5 template does). `/tokenize` gives one token per character.
- A slot holds its last prompt and the answer's tokens but the last (the answer is its text then
  one end token); a chat reuses the longest common prefix of that and its prompt: `cache_n`.
- `restart()` empties every slot (and keeps the saved files); `unified` empties the idle slots
  whenever a slot starts a chat; `save_path=False` answers a slot action with 501.
- `POST /slots/N?action=save|restore` writes and reads a slot's tokens under a file name.
- `router=True` plays a llama-server router's model `default`: `swap()` unloads it (another
  model took its place: every slot emptied); then a request with `autoload=false` is answered
  400 "model is not loaded", and any other request loads it, taking `load_s` (`GET /models`
  says `loading` meanwhile, `unloaded` before).
"""

from __future__ import annotations

import time
from typing import Any

from adapters.fake_server import ROLE, FakeServer, RecordedRequest, Reply, chunk, error_reply, json_reply, sse_reply

ANSWER = "Paris."


def render(body: dict[str, Any]) -> str:
    parts = [f"<{m['role']}>{m.get('content') or ''}</{m['role']}>" for m in body["messages"]]
    thinking = body.get("chat_template_kwargs", {}).get("enable_thinking", False)
    return "".join(parts) + "<assistant>" + ("<think>" if thinking else "")


def common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


class CachingLlama:
    def __init__(
        self,
        server: FakeServer,
        *,
        slots: int = 2,
        reasoning: str = "",
        unified: bool = False,
        save_path: bool = True,
        template: str = "tmpl",
        router: bool = False,
        load_s: float = 0.0,
    ) -> None:
        self.held: list[list[int]] = [[] for _ in range(slots)]
        self.files: dict[str, list[int]] = {}
        self.cache_n: list[int] = []
        self.reasoning = reasoning
        self.unified = unified
        self.save_path = save_path
        self.template = template
        self.slots = slots
        self.restore_lies = False  # answer a restore as done, and restore nothing
        self.bytes_per_token = 100  # what a saved file takes on disk, a token
        self.router = router
        self.load_s = load_s
        self.loaded_at: float | None = time.monotonic()  # None: unloaded; later than now: loading
        self.loads = 0
        self._route(server, "POST", "/apply-template", lambda r: json_reply({"prompt": render(r.json())}))
        self._route(
            server, "POST", "/tokenize", lambda r: json_reply({"tokens": [ord(c) for c in r.json()["content"]]})
        )
        self._route(server, "GET", "/slots", lambda r: json_reply(self._slots()))
        self._route(server, "GET", "/props", lambda r: json_reply(self._props(), head_delay_s=self._wait()))
        self._route(server, "POST", "/v1/chat/completions", self._chat)
        for slot in range(slots):
            self._route(server, "POST", f"/slots/{slot}", self._action)
        server.route("GET", "/models", lambda r: json_reply({"data": [{"id": "default", "status": self._status()}]}))

    def _route(self, server: FakeServer, method: str, path: str, handler: Any) -> None:
        def routed(request: RecordedRequest) -> Reply:
            if self.router and not self._loaded() and "autoload=false" in request.target:
                return error_reply(400, "model is not loaded", "invalid_request_error")
            return handler(request)

        server.route(method, path, routed)

    def swap(self) -> None:
        """Another model takes this one's place: unloaded, every slot emptied."""
        self.loaded_at = None
        self.restart()

    def _loaded(self) -> bool:
        return self.loaded_at is not None and self.loaded_at <= time.monotonic()

    def _status(self) -> dict[str, str]:
        if self._loaded():
            return {"value": "loaded"}
        return {"value": "unloaded" if self.loaded_at is None else "loading"}

    def _wait(self) -> float:
        """A request that may load the model: the load started if it is not loaded, and the time left."""
        if self.loaded_at is None:
            self.loads += 1
            self.loaded_at = time.monotonic() + self.load_s
        return max(self.loaded_at - time.monotonic(), 0.0)

    def restart(self) -> None:
        self.held = [[] for _ in range(self.slots)]

    def _props(self) -> dict[str, Any]:
        return {
            "default_generation_settings": {"n_ctx": 4096},
            "total_slots": self.slots,
            "model_path": "/models/m.gguf",
            "chat_template": self.template,
        }

    def _slots(self) -> list[dict[str, Any]]:
        return [
            {"id": i, "n_ctx": 4096, "is_processing": False, "n_prompt_tokens": len(held)}
            for i, held in enumerate(self.held)
        ]

    def _chat(self, request: RecordedRequest) -> Reply:
        body = request.json()
        slot = body["id_slot"]
        loading_s = self._wait()
        prompt = [ord(c) for c in render(body)]
        if self.unified:
            self.held = [held if i == slot else [] for i, held in enumerate(self.held)]
        cached = common(self.held[slot], prompt)
        self.cache_n.append(cached)
        generated = (self.reasoning + "</think>" if body["chat_template_kwargs"]["enable_thinking"] else "") + ANSWER
        self.held[slot] = prompt + [ord(c) for c in generated]  # the end token is never decoded
        predicted = len(generated) + 1
        pieces = [chunk(ROLE, n=0, cache_n=cached, prompt_n=len(prompt) - cached)]
        if self.reasoning and body["chat_template_kwargs"]["enable_thinking"]:
            pieces.append(
                chunk({"reasoning_content": self.reasoning}, n=1, cache_n=cached, prompt_n=len(prompt) - cached)
            )
        pieces.append(chunk({"content": ANSWER}, n=predicted - 1, cache_n=cached, prompt_n=len(prompt) - cached))
        pieces.append(chunk(finish="stop", n=predicted, cache_n=cached, prompt_n=len(prompt) - cached))
        return sse_reply(pieces, head_delay_s=loading_s)

    def _action(self, request: RecordedRequest) -> Reply:
        if not self.save_path:
            return error_reply(501, "This server does not support slots action.", "not_supported_error")
        slot = int(request.path.rsplit("/", 1)[1])
        name = request.json()["filename"]
        if "action=save" in request.target.split("?", 1)[1].split("&"):
            self.files[name] = list(self.held[slot])
            tokens = len(self.held[slot])
            size = self.bytes_per_token * tokens
            saved = {"id_slot": slot, "filename": name, "n_saved": tokens, "n_written": size}
            return json_reply(saved)
        if name not in self.files:
            return error_reply(400, "Unable to restore slot", "invalid_request_error")
        tokens = len(self.files[name])
        if not self.restore_lies:
            self.held[slot] = list(self.files[name])
        read = self.bytes_per_token * tokens
        return json_reply({"id_slot": slot, "filename": name, "n_restored": tokens, "n_read": read})
