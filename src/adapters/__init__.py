"""Adapters: the Unix-socket HTTP client, the scripted fake server, the TCP forwarder.

Nothing is imported here, so that `adapters.proxy` stays stdlib-only: each subpackage is loaded
only when it is asked for.
"""

__all__ = ["fake_server", "proxy", "system", "uds_http"]
