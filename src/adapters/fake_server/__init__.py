"""A scripted HTTP server on a Unix socket, and in-memory fakes that replay the same scripts."""
