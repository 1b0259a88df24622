"""The container's shared objects are built once even when several threads ask for them at once.

Each test swaps the class a provider builds for a subclass whose constructor first waits at a
`Rendezvous`: with a provider that is not thread-safe, every thread gets inside a constructor at
the same time and each builds its own object. A thread-safe provider lets one thread in; the
others wait on its lock, never arrive, and the one inside gives up waiting after `PATIENCE_S`.

Swapping the built class (`set_provides` on this container's own copy of the provider) rather
than overriding the provider is deliberate: an overriding provider answers in place of the
overridden one, lock and all, so it would test itself and not the container.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from dependency_injector import providers

from adapters.system import SystemClock
from adapters.uds_http._sync.transport import UdsTransport
from app._sync.fetch import HttpSlotProbe
from app.client import Client
from app.config import Config, parse_config
from app.container import Container
from domain.gate import SlotGate

THREADS = 8
# How long a constructor waits for the other threads to join it; a correct container makes the
# first constructor wait this long once, since the others are held outside.
PATIENCE_S = 0.2
# A bound on everything else, so that a broken test fails instead of hanging.
DEADLINE_S = 10.0

BUILT_CLASSES: dict[str, type] = {
    "clock": SystemClock,
    "rng": random.Random,
    "transport": UdsTransport,
    "probe": HttpSlotProbe,
    "gate": SlotGate,
    "client": Client,
}


class Rendezvous:
    """Holds each caller until `parties` callers are inside at once, or until the first of them
    has waited `patience` seconds; from then on it holds nobody."""

    def __init__(self, parties: int, patience: float) -> None:
        self._parties = parties
        self._patience = patience
        self._lock = threading.Lock()
        self._arrived = 0
        self._open = threading.Event()

    def arrive(self) -> None:
        with self._lock:
            self._arrived += 1
            if self._arrived >= self._parties:
                self._open.set()
        if not self._open.wait(self._patience):
            self._open.set()  # nobody else is coming: later constructors do not wait again


def waiting_subclass(cls: type, rendezvous: Rendezvous, built: list[object]) -> type:
    """`cls`, with a constructor that waits at `rendezvous` and records each object it builds."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        rendezvous.arrive()
        built.append(self)
        cls.__init__(self, *args, **kwargs)

    return type(f"Waiting{cls.__name__}", (cls,), {"__init__": __init__})


@pytest.fixture
def config() -> Config:
    return parse_config({"socket": "/tmp/does-not-matter.sock"})


def slowed_container(config: Config) -> tuple[Container, dict[str, list[object]]]:
    """A fresh container whose every shared object is built by a waiting subclass; returns it with
    the objects each provider built."""
    container = Container(config=config)
    rendezvous = Rendezvous(THREADS, PATIENCE_S)
    built: dict[str, list[object]] = {name: [] for name in BUILT_CLASSES}
    for name, cls in BUILT_CLASSES.items():
        getattr(container, name).set_provides(waiting_subclass(cls, rendezvous, built[name]))
    return container, built


def resolve_at_once(resolve: Callable[[], object]) -> list[object]:
    """`resolve()` from THREADS threads that all start together; what each one got."""
    start = threading.Barrier(THREADS, timeout=DEADLINE_S)

    def one() -> object:
        start.wait()
        return resolve()

    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        futures = [pool.submit(one) for _ in range(THREADS)]
        return [f.result(timeout=DEADLINE_S) for f in futures]


def test_every_shared_object_is_a_thread_safe_singleton() -> None:
    # Also guards providers added later, which the tests below do not name.
    singletons = {name for name, p in Container.providers.items() if isinstance(p, providers.BaseSingleton)}
    assert singletons >= set(BUILT_CLASSES)
    plain = sorted(n for n in singletons if type(Container.providers[n]) is not providers.ThreadSafeSingleton)
    assert plain == []


def test_eight_threads_resolving_the_client_at_once_build_one_of_each_object(config: Config) -> None:
    container, built = slowed_container(config)
    clients = resolve_at_once(container.client)
    assert {id(c) for c in clients} == {id(built["client"][0])}
    assert {name: len(objects) for name, objects in built.items()} == dict.fromkeys(BUILT_CLASSES, 1)
    # The client holds the very objects the container hands out to anyone else.
    assert container.gate() is built["gate"][0]
    assert container.transport() is built["transport"][0]
    assert container.probe() is built["probe"][0]


@pytest.mark.parametrize("name", sorted(BUILT_CLASSES))
def test_eight_threads_resolving_one_provider_at_once_get_one_object(config: Config, name: str) -> None:
    container, built = slowed_container(config)
    got = resolve_at_once(getattr(container, name))
    assert len(built[name]) == 1
    assert all(obj is built[name][0] for obj in got)


def test_two_containers_still_build_their_own_objects(config: Config) -> None:
    # Thread safety must not turn the container's singletons into process-wide ones.
    first, second = Container(config=config), Container(config=config)
    assert first.client() is not second.client()
    assert first.gate() is not second.gate()
