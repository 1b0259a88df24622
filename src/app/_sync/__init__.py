# Generated from src/app/_async/__init__.py by scripts/unasync.py: do not edit.
"""The call, written once for asyncio; the sibling `_sync` package is generated from it by
`scripts/unasync.py`."""

__all__: list[str] = []
