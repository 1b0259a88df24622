"""The pure core of the inference path: value types, errors and the policies that decide what to do.

`__all__` names the modules a caller of the client imports from. The others (the wire format, the
slot gate, the wait, liveness, thinking and retry policies, the request builder) are the client's
own machinery, assembled by `app.container`.
"""

__all__ = ["cache", "cancel", "completion", "errors", "events", "hashing", "messages"]
