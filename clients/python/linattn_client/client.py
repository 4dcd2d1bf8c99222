"""Client: one gRPC channel to a linattn-server and its three services."""
import enum
import time

import grpc

from . import _connection, _rpc, errors
from .attention import AttentionSpec, Session, SessionInfo, _decode_request, _output, _tokens
from .generation import ModelInfo, ModelSession, ModelSessionInfo
from .proto import (attention_pb2, attention_pb2_grpc, generation_pb2, generation_pb2_grpc,
                    health_pb2, health_pb2_grpc)

__all__ = ["Client", "HealthStatus"]


class HealthStatus(str, enum.Enum):
    """grpc.health.v1's serving status (compares equal to its name)."""
    UNKNOWN = "UNKNOWN"
    SERVING = "SERVING"
    NOT_SERVING = "NOT_SERVING"
    SERVICE_UNKNOWN = "SERVICE_UNKNOWN"

    def __str__(self):
        return self.value


class Client:
    """A connection to linattn-server.

        with linattn_client.Client("127.0.0.1:50051", timeout=30) as client:
            assert client.health() == "SERVING"

    Over TLS, with a client certificate (mTLS) and an API key:

        client = linattn_client.Client("linattn.example:50051", tls_ca="ca.pem",
                                       tls_cert="client.pem", tls_key="client.key",
                                       api_key=pathlib.Path("api-key").read_text().strip())

    target: host:port (any gRPC target). timeout: the deadline in seconds of
    every call (a Generate stream or a decode counts as one call); None = no
    deadline. options: extra gRPC channel arguments (message sizes are
    unlimited on this side; the server enforces its own limit).

    TLS (default plaintext), either through grpc.ChannelCredentials as
    credentials, or through files (not both: ValueError):
    - tls_ca: path of the PEM CA certificates that verify the server's
      certificate (default: the system's);
    - tls_cert, tls_key: paths of the PEM certificate chain this client
      presents and its private key (mTLS), both or neither (ValueError);
    - tls_server_name: the name the server's certificate must carry, instead
      of the host of target (an IP address, or a proxy's name).
    Giving any of these four turns TLS on. A file that cannot be read raises
    OSError; one that is empty or not PEM, ValueError.

    api_key: sent as `authorization: Bearer KEY` metadata on every call, over
    TLS or plaintext (where it crosses the network in the clear); None (the
    default) takes the environment's LINATTN_API_KEY (unset or empty = no
    key), "" sends none. A key must be printable ASCII not starting with a
    space (ValueError otherwise).

    The client is thread-safe; close() (or leaving the `with` block) closes
    the channel. channel (which adds the API key to every call made on it),
    attention_stub, generation_stub and health_stub are there for calls
    these wrappers do not make.
    """

    def __init__(self, target="127.0.0.1:50051", *, timeout=None, credentials=None, options=(),
                 tls_ca=None, tls_cert=None, tls_key=None, tls_server_name=None, api_key=None):
        self.target = target
        self.timeout = timeout
        opts = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
        opts += list(options)
        self.channel = _connection.open_channel(
            target, credentials=credentials, options=opts, tls_ca=tls_ca, tls_cert=tls_cert,
            tls_key=tls_key, tls_server_name=tls_server_name, api_key=api_key)
        self.attention_stub = attention_pb2_grpc.AttentionServiceStub(self.channel)
        self.generation_stub = generation_pb2_grpc.GenerationServiceStub(self.channel)
        self.health_stub = health_pb2_grpc.HealthStub(self.channel)

    def __repr__(self):
        return f"<linattn_client.Client {self.target}>"

    def close(self):
        """Closes the channel (calls still running are cancelled)."""
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, method, request, session_id=None):
        return _rpc.call(method, request, timeout=self.timeout, session_id=session_id)

    # Health (grpc.health.v1) ------------------------------------------------

    def health(self, service=""):
        """The serving status of service ("" = the server as a whole,
        "linattn.v1.AttentionService", "linattn.v1.GenerationService"): a
        HealthStatus, equal to "SERVING", "NOT_SERVING" (draining),
        "SERVICE_UNKNOWN" (a name the server does not know) or "UNKNOWN".
        Raises Unavailable when the server cannot be reached."""
        try:
            resp = self._call(self.health_stub.Check, health_pb2.HealthCheckRequest(service=service))
        except errors.NotFound:
            return HealthStatus.SERVICE_UNKNOWN
        name = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
        return HealthStatus(name) if name in HealthStatus.__members__ else HealthStatus.UNKNOWN

    def is_serving(self, service=""):
        """True if the server answers SERVING for service; False for any other
        status or when it cannot be reached."""
        try:
            return self.health(service) == HealthStatus.SERVING
        except (errors.Unavailable, errors.DeadlineExceeded):
            return False

    def wait_until_serving(self, timeout=30.0, service=""):
        """Polls health until SERVING; raises TimeoutError after timeout s."""
        deadline = time.monotonic() + timeout
        while True:
            if self.is_serving(service):
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{self.target} not SERVING after {timeout} s")
            time.sleep(0.05)

    # AttentionService -------------------------------------------------------

    def create_session(self, spec=None, *, session_id=None, **fields):
        """A new attention session: a Session (a context manager that deletes
        it on exit).

            client.create_session(num_heads=8, key_dim=64, value_dim=64)
            client.create_session(AttentionSpec(8, 64, 64, feature_map="favor", seed=7))

        spec: an AttentionSpec, or its fields as keywords. session_id:
        optional, 1–128 characters of [A-Za-z0-9._-]; default a random
        128-bit id chosen here (AlreadyExists if taken)."""
        if spec is None:
            spec = AttentionSpec(**fields)
        elif fields:
            raise TypeError("pass either an AttentionSpec or its fields, not both")
        sid = session_id or _rpc.new_session_id()
        resp = self._call(self.attention_stub.CreateSession,
                          attention_pb2.CreateSessionRequest(spec=spec.to_proto(), session_id=sid),
                          sid)
        return Session(self, SessionInfo.from_proto(resp))

    def session(self, session_id):
        """The existing attention session session_id (NotFound if none)."""
        resp = self._call(self.attention_stub.GetSession,
                          attention_pb2.GetSessionRequest(session_id=session_id), session_id)
        return Session(self, SessionInfo.from_proto(resp))

    def list_sessions(self):
        """Every attention session on the server, as Session objects."""
        resp = self._call(self.attention_stub.ListSessions, attention_pb2.ListSessionsRequest())
        return [Session(self, SessionInfo.from_proto(s)) for s in resp.sessions]

    def restore_session(self, state, *, session_id=None):
        """A new session from Session.snapshot() bytes (DataLoss for a damaged
        blob, InvalidArgument for bytes that are not an attention snapshot)."""
        sid = session_id or _rpc.new_session_id()
        resp = self._call(self.attention_stub.Restore,
                          attention_pb2.RestoreRequest(state=bytes(state), session_id=sid), sid)
        return Session(self, SessionInfo.from_proto(resp))

    def delete_session(self, session_id):
        """Deletes an attention session by id (NotFound if there is none)."""
        self._call(self.attention_stub.DeleteSession,
                   attention_pb2.DeleteSessionRequest(session_id=session_id), session_id)

    def decode_batch(self, steps):
        """One decode step of each of several sessions in one DecodeBatch
        message, run as one batch: all of them or none.

        steps: (session, q, k, v[, expected_position[, g[, beta[, a[, b]]]]])
        tuples, each session at most once, q and k (num_heads, key_dim), v
        (num_heads, value_dim) of that session's spec, and for the gated,
        delta and rwkv7 rules its log-gates g, β, a and b (as
        Session.decode). Returns one
        AttentionOutput per step, in order. A bad step raises (its message
        names steps[i]) and changes no session."""
        request = attention_pb2.DecodeBatchRequest()
        sessions = []
        for i, step in enumerate(steps):
            session, q, k, v, *rest = step
            spec = session.spec
            q, single = _tokens(f"steps[{i}].q", q, spec.num_heads, spec.key_dim)
            k, _ = _tokens(f"steps[{i}].k", k, spec.num_heads, spec.key_dim)
            v, _ = _tokens(f"steps[{i}].v", v, spec.num_heads, spec.value_dim)
            if not single or k.shape[0] != 1 or v.shape[0] != 1:
                raise errors.error(grpc.StatusCode.INVALID_ARGUMENT,
                                   f"steps[{i}]: one token per session: (heads, dim) arrays")
            expected, g, beta, a, b = (list(rest) + [None] * 5)[:5]
            request.steps.append(_decode_request(session.id, q[0], k[0], v[0], expected,
                                                 g, beta, a, b))
            sessions.append(session)
        if not sessions:
            return []
        try:
            replies = list(self.attention_stub.DecodeBatch(
                iter([request]), timeout=self.timeout, metadata=_rpc.metadata(sessions[0].id)))
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from e
        if len(replies) != 1 or len(replies[0].steps) != len(sessions):
            raise errors.error(grpc.StatusCode.UNKNOWN,
                               f"DecodeBatch answered {len(replies)} messages for one")
        outputs = []
        for session, resp in zip(sessions, replies[0].steps):
            session.position = resp.position
            outputs.append(_output(session.spec, 1, resp, True))
        return outputs

    # GenerationService ------------------------------------------------------

    def list_models(self):
        """The models the server serves: ModelInfo objects (the first is the
        default of model_session)."""
        resp = self._call(self.generation_stub.ListModels, generation_pb2.ListModelsRequest())
        return [ModelInfo.from_proto(m) for m in resp.models]

    def model_session(self, model=None, *, session_id=None):
        """A new, empty session of model (None = the server's first): a
        ModelSession (a context manager that deletes it on exit)."""
        sid = session_id or _rpc.new_session_id()
        resp = self._call(self.generation_stub.CreateSession,
                          generation_pb2.CreateModelSessionRequest(model=model or "", session_id=sid),
                          sid)
        return ModelSession(self, ModelSessionInfo.from_proto(resp))

    def get_model_session(self, session_id):
        """The existing model session session_id (NotFound if none)."""
        resp = self._call(self.generation_stub.GetSession,
                          generation_pb2.GetModelSessionRequest(session_id=session_id), session_id)
        return ModelSession(self, ModelSessionInfo.from_proto(resp))

    def list_model_sessions(self):
        """Every model session on the server, as ModelSession objects."""
        resp = self._call(self.generation_stub.ListSessions,
                          generation_pb2.ListModelSessionsRequest())
        return [ModelSession(self, ModelSessionInfo.from_proto(s)) for s in resp.sessions]

    def restore_model_session(self, state, *, session_id=None):
        """A new model session from ModelSession.snapshot() bytes
        (FailedPrecondition unless this server has the same model)."""
        sid = session_id or _rpc.new_session_id()
        resp = self._call(self.generation_stub.Restore,
                          generation_pb2.RestoreModelSessionRequest(state=bytes(state),
                                                                    session_id=sid), sid)
        return ModelSession(self, ModelSessionInfo.from_proto(resp))

    def delete_model_session(self, session_id):
        """Deletes a model session by id (NotFound if there is none)."""
        self._call(self.generation_stub.DeleteSession,
                   generation_pb2.DeleteModelSessionRequest(session_id=session_id), session_id)
