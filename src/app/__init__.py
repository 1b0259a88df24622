"""The imperative shell: configuration, the composition root, the client, the self-test.

`__version__` is the installed distribution's version; "0+unknown" only when the package runs
from a source tree that was never installed.
"""

from importlib import metadata as _metadata

__all__ = ["__version__", "async_client", "client", "config", "container", "selftest"]

try:
    __version__ = _metadata.version("inferpath")
except _metadata.PackageNotFoundError:
    __version__ = "0+unknown"
