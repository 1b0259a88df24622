"""inferpath: the inference path between an agent daemon and llama-server.

One import gives every public name::

    from inferpath import Container, load_config, ChatRequest, UserMessage

    with Container(config=load_config("config.toml")).client() as client:
        completion = client.chat(ChatRequest(slot=0, messages=[UserMessage("Hi")]), print)

Each name is the very object of its home module (`app.client.Client` is `inferpath.Client`):
the home modules' import paths stay valid. The errors are drawn as a tree in `domain.errors`.
"""

from app import __version__
from app.async_client import AsyncClient
from app.client import Client
from app.config import Config, ConfigError, load_config, parse_config
from app.container import Container
from domain.cache import CacheOutcome, cache_outcome
from domain.cancel import CancelToken
from domain.completion import Completion, FinishReason, Timings
from domain.errors import (
    AnswerError,
    Busy,
    CallerError,
    Cancelled,
    ClientClosed,
    ConnectError,
    HttpError,
    InferError,
    InferTimeout,
    LoadTimeout,
    ModelNotLoaded,
    NetworkError,
    ProtocolError,
    ProxyRefused,
    RequestError,
    Stalled,
    StreamClosedEarly,
    ThinkingOverrun,
    WaitTimeout,
)
from domain.events import (
    CacheCause,
    CachePrediction,
    ChatEvent,
    Content,
    ModelWait,
    Progress,
    Queued,
    Reasoning,
    Retrying,
    SessionMoved,
    SessionRestored,
    SessionSaved,
    ThinkingCapped,
    ToolCallDelta,
    Waiting,
)
from domain.hashing import sha256
from domain.llama_api import Props, SlotInfo, Token
from domain.messages import (
    AssistantMessage,
    ChatMessage,
    ChatRequest,
    Sampling,
    SystemMessage,
    ToolCall,
    ToolMessage,
    ToolSchema,
    UserMessage,
)
from domain.openai_form import from_openai, to_openai, tools_from_openai, tools_to_openai
from domain.prompt_cache import Checkpoint

__all__ = [
    "AnswerError",
    "AssistantMessage",
    "AsyncClient",
    "Busy",
    "CacheCause",
    "CacheOutcome",
    "CachePrediction",
    "CallerError",
    "CancelToken",
    "Cancelled",
    "ChatEvent",
    "ChatMessage",
    "ChatRequest",
    "Checkpoint",
    "Client",
    "ClientClosed",
    "Completion",
    "Config",
    "ConfigError",
    "ConnectError",
    "Container",
    "Content",
    "FinishReason",
    "HttpError",
    "InferError",
    "InferTimeout",
    "LoadTimeout",
    "ModelNotLoaded",
    "ModelWait",
    "NetworkError",
    "Progress",
    "Props",
    "ProtocolError",
    "ProxyRefused",
    "Queued",
    "Reasoning",
    "RequestError",
    "Retrying",
    "Sampling",
    "SessionMoved",
    "SessionRestored",
    "SessionSaved",
    "SlotInfo",
    "Stalled",
    "StreamClosedEarly",
    "SystemMessage",
    "ThinkingCapped",
    "ThinkingOverrun",
    "Timings",
    "Token",
    "ToolCall",
    "ToolCallDelta",
    "ToolMessage",
    "ToolSchema",
    "UserMessage",
    "WaitTimeout",
    "Waiting",
    "__version__",
    "cache_outcome",
    "from_openai",
    "load_config",
    "parse_config",
    "sha256",
    "to_openai",
    "tools_from_openai",
    "tools_to_openai",
]
