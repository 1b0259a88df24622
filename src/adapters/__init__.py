"""Adapters: the Unix-socket HTTP client, the scripted fake server, the TCP forwarder."""
