"""The real `/slots` probe in both flavours: `HttpSlotProbe` (blocking) is generated from
`AsyncHttpSlotProbe` (asyncio); see `app._async.fetch`, the one source, for what it answers."""

from app._async.fetch import AsyncHttpSlotProbe
from app._sync.fetch import HttpSlotProbe

__all__ = ["AsyncHttpSlotProbe", "HttpSlotProbe"]
