"""The call, written once for asyncio; the sibling `_sync` package is generated from it by
`scripts/unasync.py`."""

__all__: list[str] = []
