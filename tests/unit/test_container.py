"""The composition root builds from a `Config` alone, and tests can override its providers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from dependency_injector import errors, providers

from app.config import Config, parse_config
from app.container import Container


class StoppedClock:
    def __init__(self) -> None:
        self.t = 100.0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float, wake: object = None) -> None:
        self.t += seconds


@pytest.fixture
def config() -> Config:
    return parse_config({"socket": "/tmp/does-not-matter.sock"})


@pytest.fixture
def container(config: Config) -> Iterator[Container]:
    container = Container(config=config)
    with container.override_providers(clock=StoppedClock()):
        yield container


def test_container_resolves_every_dependency_from_config_alone(config: Config) -> None:
    Container(config=config).check_dependencies()


def test_container_without_config_names_the_missing_dependency() -> None:
    with pytest.raises(errors.Error, match="config"):
        Container().check_dependencies()


def test_overridden_clock_is_what_the_container_hands_out(container: Container) -> None:
    clock = container.clock()
    assert isinstance(clock, StoppedClock)
    clock.sleep(2.5)
    assert container.clock().now() == 102.5


def test_real_clock_is_monotonic_and_refuses_negative_sleep(config: Config) -> None:
    clock = Container(config=config).clock()
    a = clock.now()
    clock.sleep(0)
    assert clock.now() >= a
    with pytest.raises(ValueError, match="negative"):
        clock.sleep(-1)


@pytest.mark.parametrize("given", [None, {"socket": "/run/infer.sock"}, "config.toml"], ids=["none", "dict", "path"])
def test_a_config_that_is_not_a_config_is_a_type_error_naming_it(given: object) -> None:
    with pytest.raises(TypeError, match=r"config must be an app\.config\.Config .* not (NoneType|dict|str)"):
        Container(config=given)


def test_a_config_given_as_a_provider_is_taken(config: Config) -> None:
    Container(config=providers.Object(config)).check_dependencies()
