"""Helpers shared by the service wrappers (not part of the API)."""
import secrets

import grpc
import numpy as np

from . import errors

SESSION_ID_METADATA = "x-session-id"


def new_session_id():
    """128 random bits as 32 hex digits, as the server would choose. Clients
    choose the ids of the sessions they create so that every call, the
    creating one included, can name its session to a proxy in front of
    replicas (the x-session-id metadata)."""
    return secrets.token_hex(16)


def metadata(session_id):
    return ((SESSION_ID_METADATA, session_id),) if session_id else None


def call(method, request, *, timeout, session_id=None):
    """A unary call whose failure raises errors.Error."""
    try:
        return method(request, timeout=timeout, metadata=metadata(session_id))
    except grpc.RpcError as e:
        raise errors.from_rpc_error(e) from e


class SessionHandle:
    """What both kinds of session share: the id, the calls that name it, and
    deletion when closed (as a context manager, on leaving the block)."""

    def __init__(self, client, info):
        self._client = client
        self.id = info.id
        self.state_bytes = info.state_bytes
        self.position = info.position
        self._deleted = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, method, request):
        return call(method, request, timeout=self._client.timeout, session_id=self.id)

    def _delete(self, method, request):
        self._call(method, request)
        self._deleted = True

    def delete(self):
        raise NotImplementedError

    def close(self):
        """Deletes the session unless it was deleted already (or is gone)."""
        if self._deleted:
            return
        try:
            self.delete()
        except errors.NotFound:
            self._deleted = True


def set_tensor(message, field, values):
    """values (a float32 array) into the bytes form of a request's tensor,
    message.<field>_bytes: packed little-endian float32, one copy of the
    array's bytes (the server then answers with output_bytes)."""
    values = np.ascontiguousarray(values, dtype="<f4").reshape(-1)
    setattr(message, field + "_bytes", values.tobytes())


def tensor(message, field, shape):
    """A response tensor as a float32 array of `shape`, from
    message.<field>_bytes when the server answered in bytes, else from the
    repeated field."""
    packed = getattr(message, field + "_bytes")
    if packed:
        return np.frombuffer(packed, dtype="<f4").astype(np.float32).reshape(shape)
    return floats(getattr(message, field), shape)


def floats(container, shape):
    """A repeated float field as a float32 array of `shape`."""
    return np.fromiter(container, dtype=np.float32, count=len(container)).reshape(shape)


def bools(container, shape):
    return np.fromiter(container, dtype=bool, count=len(container)).reshape(shape)
