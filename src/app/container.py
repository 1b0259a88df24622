"""The one composition root. Everything is built from a `Config` alone.

Tests override providers with fakes (`with container.override_providers(transport=..., clock=...)`);
the classes assembled here import nothing from dependency-injector.
"""

from __future__ import annotations

import random
from typing import Any

from dependency_injector import containers, providers

from adapters.system import AsyncSystemClock, SystemClock
from adapters.uds_http._async.transport import AsyncUdsTransport
from adapters.uds_http._sync.transport import UdsTransport
from adapters.uds_http.places import Places
from app._async.fetch import AsyncHttpSlotProbe
from app._sync.fetch import HttpSlotProbe
from app.async_client import AsyncClient
from app.client import Client
from app.config import Config
from app.slot_memory import SlotMemory
from domain.connect_budget import ConnectBudget
from domain.gate import SlotGate
from domain.limits import ClientLimits, FetchLimits, StreamLimits
from domain.prompt_cache import CacheSettings
from domain.request import RequestSettings
from domain.retry import RetryPolicy


def request_settings(config: Config) -> RequestSettings:
    s = config.sampling
    return RequestSettings(
        model=config.model,
        max_tokens=config.limits.max_tokens,
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=s.top_k,
        min_p=s.min_p,
        seed=s.seed,
        thinking_budget=config.limits.thinking_cap,
    )


def seconds(ms: int) -> float:
    """A config value in milliseconds (every `*_ms` key) as the seconds the client works in."""
    return ms / 1000


def client_limits(config: Config) -> ClientLimits:
    lim = config.limits
    return ClientLimits(
        poll_s=seconds(lim.poll_ms),
        busy_wait_s=seconds(lim.busy_wait_ms),
        load_wait_s=seconds(lim.load_wait_ms),
        idle_grace_s=seconds(lim.idle_grace_ms),
        body_bytes=lim.body_bytes,
        error_body_bytes=lim.error_body_bytes,
        stream=StreamLimits(
            liveness_s=seconds(lim.liveness_ms),
            sse_line_bytes=lim.sse_line_bytes,
            answer_bytes=lim.answer_bytes,
            thinking_cap=lim.thinking_cap,
            thinking_overrun=lim.thinking_overrun,
            tool_calls=lim.tool_calls,
            error_body_bytes=lim.error_body_bytes,
        ),
    )


def retry_policy(config: Config, rng: random.Random) -> RetryPolicy:
    r = config.retry
    delays_s = tuple(seconds(delay) for delay in r.delays_ms)
    total_s = seconds(r.total_ms)
    return RetryPolicy(
        attempts=r.attempts,
        delays_s=delays_s,
        jitter=r.jitter,
        total_s=total_s,
        rng=rng,
    )


def probe_limits(limits: ClientLimits) -> FetchLimits:
    return limits.probe()


def connect_budget(config: Config) -> ConnectBudget:
    return ConnectBudget.of_proxy(config.proxy.burst, float(config.proxy.rate))


def connection_places(config: Config) -> Places:
    return Places.of_proxy(config.proxy.max_conns)


def cache_settings(config: Config) -> CacheSettings:
    return CacheSettings(predict=config.cache.predict, loss_tokens=config.limits.cache_loss_tokens)


def slot_memory(config: Config) -> SlotMemory:
    disk = config.cache.session_disk_mb * 1_000_000
    return SlotMemory(session_disk_bytes=disk, model=config.model)


def total_slots(config: Config) -> int | None:
    return config.expect.total_slots if config.expect is not None else None


def n_ctx(config: Config) -> int | None:
    """A slot's context as the config pins it (else the client takes it from `/props`)."""
    return config.expect.n_ctx if config.expect is not None else None


class Container(containers.DeclarativeContainer):
    config = providers.Dependency(instance_of=Config)

    def __new__(cls, **overriding: Any) -> Any:
        """`Container(config=...)`: a config that is not a `Config` (None, a dict) is a
        `TypeError` here, not a dependency-injector error at the first `client()`."""
        given = overriding.get("config", Config)
        if given is not Config and not isinstance(given, (Config, providers.Provider)):
            raise TypeError(
                "config must be an app.config.Config (from load_config or parse_config),"
                f" not {type(given).__name__}"
            )
        return super().__new__(cls, **overriding)

    # Thread-safe: a daemon may resolve `client()` from several threads at once, and a plain
    # Singleton would then build one client, one slot gate and one transport per thread.
    clock = providers.ThreadSafeSingleton(SystemClock)
    async_clock = providers.ThreadSafeSingleton(AsyncSystemClock)
    limits = providers.ThreadSafeSingleton(client_limits, config)
    rng = providers.ThreadSafeSingleton(random.Random)
    # One accept budget for every connect of both flavours: the proxy counts them all alike.
    budget = providers.ThreadSafeSingleton(connect_budget, config)
    # One count of open connections for both flavours likewise: the proxy's concurrency limit.
    places = providers.ThreadSafeSingleton(connection_places, config)
    transport = providers.ThreadSafeSingleton(
        UdsTransport,
        socket_path=config.provided.socket,
        header_bytes=config.provided.limits.header_bytes,
        budget=budget,
        places=places,
    )
    probe = providers.ThreadSafeSingleton(
        HttpSlotProbe,
        transport=transport,
        clock=clock,
        limits=providers.Callable(probe_limits, limits),
        model=config.provided.model,
    )
    gate = providers.ThreadSafeSingleton(
        SlotGate, queue_per_slot=config.provided.limits.queue_per_slot
    )
    # what the slots hold, as both flavours saw it, and the sessions on them
    memory = providers.ThreadSafeSingleton(slot_memory, config)
    client = providers.ThreadSafeSingleton(
        Client,
        transport=transport,
        probe=probe,
        clock=clock,
        gate=gate,
        retry_policy=providers.Callable(retry_policy, config, rng),
        request_settings=providers.Callable(request_settings, config),
        limits=limits,
        total_slots=providers.Callable(total_slots, config),
        n_ctx=providers.Callable(n_ctx, config),
        cache=providers.Callable(cache_settings, config),
        memory=memory,
    )

    # The asyncio client: the same settings, limits, slot gate (so a sync call and an async call
    # never hold one slot at once) and slot memory (a turn or checkpoint of one is the other's),
    # its own clock, transport and probe on the event loop.
    async_transport = providers.ThreadSafeSingleton(
        AsyncUdsTransport,
        socket_path=config.provided.socket,
        header_bytes=config.provided.limits.header_bytes,
        budget=budget,
        places=places,
    )
    async_probe = providers.ThreadSafeSingleton(
        AsyncHttpSlotProbe,
        transport=async_transport,
        clock=async_clock,
        limits=providers.Callable(probe_limits, limits),
        model=config.provided.model,
    )
    async_client = providers.ThreadSafeSingleton(
        AsyncClient,
        transport=async_transport,
        probe=async_probe,
        clock=async_clock,
        gate=gate,
        retry_policy=providers.Callable(retry_policy, config, rng),
        request_settings=providers.Callable(request_settings, config),
        limits=limits,
        total_slots=providers.Callable(total_slots, config),
        n_ctx=providers.Callable(n_ctx, config),
        cache=providers.Callable(cache_settings, config),
        memory=memory,
    )
