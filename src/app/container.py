"""The one composition root. Everything is built from a `Config` alone.

Tests override providers with fakes (`with container.override_providers(clock=...)`); the
classes assembled here import nothing from dependency-injector.
"""

from __future__ import annotations

from dependency_injector import containers, providers

from adapters.system import SystemClock
from app.config import Config


class Container(containers.DeclarativeContainer):
    config = providers.Dependency(instance_of=Config)
    clock = providers.Singleton(SystemClock)
