"""Exceptions: every failed call raises an Error that keeps the gRPC status.

The server's statuses (proto/linattn/v1/attention.proto, docs/server.md "Errors"):

- InvalidArgument: bad input; the message names the field
  (``q: expected 512 floats (...)``, ``spec.feature_map: ...``);
- NotFound: no session with that id, or no such model;
- AlreadyExists: a chosen session id is taken;
- ResourceExhausted: a session, memory or message-size limit;
- OutOfRange: past a cosine horizon, or values that would overflow fp32;
- FailedPrecondition: a model snapshot of another model, a decode step whose
  expected_position is not the session's;
- DataLoss: a damaged snapshot;
- Unavailable: the server is unreachable or draining (or a TLS handshake
  failed: an untrusted server certificate, a client certificate refused);
- Unauthenticated: the server takes API keys and the call had none, or not
  a valid one;
- DeadlineExceeded / Cancelled: nothing was applied.

Every Error is a grpc.RpcError with grpc's ``code()`` and ``details()``, so
code written against raw stubs handles it unchanged. A failed request leaves
the session exactly as it was (except a multi-token ``decode``, see there).
"""
import grpc

__all__ = ["Error", "Cancelled", "InvalidArgument", "DeadlineExceeded", "NotFound",
           "AlreadyExists", "ResourceExhausted", "FailedPrecondition", "OutOfRange",
           "DataLoss", "Unavailable", "Unauthenticated", "from_rpc_error"]


class Error(grpc.RpcError):
    """A linattn call failed with a gRPC status.

    ``code()`` is the grpc.StatusCode and ``details()`` the server's message;
    ``str(e)`` is ``"INVALID_ARGUMENT: q: expected ..."``.
    """

    def __init__(self, code, details):
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details

    def code(self):
        """The grpc.StatusCode."""
        return self._code

    def details(self):
        """The status message (names the field for INVALID_ARGUMENT)."""
        return self._details

    def __str__(self):
        return f"{self._code.name}: {self._details}"

    def __repr__(self):
        return f"{type(self).__name__}({self._code!r}, {self._details!r})"


class Cancelled(Error):
    """CANCELLED: the call was cancelled before the request was applied."""


class InvalidArgument(Error):
    """INVALID_ARGUMENT: bad input; details() names the field."""


class DeadlineExceeded(Error):
    """DEADLINE_EXCEEDED: the deadline passed before the request was applied."""


class NotFound(Error):
    """NOT_FOUND: no such session or model."""


class AlreadyExists(Error):
    """ALREADY_EXISTS: the chosen session id is taken."""


class ResourceExhausted(Error):
    """RESOURCE_EXHAUSTED: a session, memory or message-size limit."""


class FailedPrecondition(Error):
    """FAILED_PRECONDITION: a snapshot of another model, or a step whose
    expected position is not the session's."""


class OutOfRange(Error):
    """OUT_OF_RANGE: past a cosine horizon, or values fp32 state cannot hold."""


class DataLoss(Error):
    """DATA_LOSS: a damaged snapshot (cut short, or a checksum mismatch)."""


class Unavailable(Error):
    """UNAVAILABLE: the server cannot be reached, or is draining."""


class Unauthenticated(Error):
    """UNAUTHENTICATED: no API key, or not a valid one (Client(api_key=...)
    or LINATTN_API_KEY)."""


_BY_CODE = {
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.OUT_OF_RANGE: OutOfRange,
    grpc.StatusCode.DATA_LOSS: DataLoss,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
}


def error(code, details):
    """The Error subclass for `code`, with `details`."""
    return _BY_CODE.get(code, Error)(code, details)


def from_rpc_error(e):
    """The Error for a grpc.RpcError raised by a stub (or e itself if it is
    one already)."""
    if isinstance(e, Error):
        return e
    code = e.code() if callable(getattr(e, "code", None)) else grpc.StatusCode.UNKNOWN
    details = e.details() if callable(getattr(e, "details", None)) else str(e)
    return error(code or grpc.StatusCode.UNKNOWN, details or "")
