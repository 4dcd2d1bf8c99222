"""AttentionService: linear-attention sessions, with numpy in and out.

A session keeps, per head h, the running sums of docs/design.md §1

    S_t = γ·S_{t−1} + φ(k_t) v_tᵀ,   z_t = γ·z_{t−1} + φ(k_t)
    y_t = φ(q_t)ᵀ S_t / (φ(q_t)ᵀ z_t + ε)     (φ(q_t)ᵀ S_t when unnormalized)

Arrays are float32 (other dtypes are converted): q and k are shaped
(tokens, num_heads, key_dim) or, for one token, (num_heads, key_dim); v is
(tokens, num_heads, value_dim) or (num_heads, value_dim). Results keep the
same leading shape: output (tokens, num_heads, value_dim) or (num_heads,
value_dim), denominator and available (tokens, num_heads) or (num_heads,).
Sessions come from linattn_client.Client (create_session, session,
restore_session, list_sessions).
"""
import dataclasses
import queue
from typing import Optional, Tuple

import grpc
import numpy as np

from . import _rpc, _shared_memory, errors
from .proto import attention_pb2 as pb

__all__ = ["AttentionSpec", "SessionInfo", "AttentionOutput", "SessionState", "Session",
           "Decoder"]

_END = object()


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
    """The shape and kind of a session's attention (proto AttentionSpec).

    feature_map: "elu1" (ELU+1, the default), "relu", "identity" (requires
    unnormalized), "favor" (Performer FAVOR+: feature_dim m, default
    2·key_dim, and seed) or "cosine" (cosFormer: horizon required).
    epsilon: added to the denominator; None = the server's default (the
    session's spec then reports the value), 0 = exact (a zero denominator is
    reported as unavailable). decay: γ per head in [0, 1]; empty = none.

    rule: "linear" (the above, the default), "gated", "delta",
    "gated_delta", "rwkv7" or "rwkv6" (docs/design.md §1): unnormalised,
    identity features (leave feature_map and unnormalized at their
    defaults), per-token log-gates g (gated rules, rwkv7, rwkv6), β (delta
    rules) and a, b (rwkv7) passed to decode and prefill. gate: "head" (one
    log-gate per head, the default) or "key" (one per key channel: gated,
    and rwkv7's and rwkv6's only shape). qk_l2norm: q and k L2-normalised
    per head first; scale: q's multiplier after that (0 = 1). bonus: rwkv6's
    u, num_heads·key_dim values (head-major), the weight of each token's
    own k vᵀ in its read-out.
    """
    num_heads: int
    key_dim: int
    value_dim: int
    feature_map: str = "elu1"
    unnormalized: bool = False
    epsilon: Optional[float] = None
    decay: Tuple[float, ...] = ()
    feature_dim: int = 0
    seed: int = 0
    horizon: int = 0
    rule: str = "linear"
    gate: str = ""
    qk_l2norm: bool = False
    scale: float = 0.0
    bonus: Tuple[float, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "decay", tuple(float(g) for g in self.decay))
        object.__setattr__(self, "bonus",
                           tuple(float(u) for u in np.asarray(self.bonus).reshape(-1)))

    def to_proto(self):
        """The linattn.v1.AttentionSpec message."""
        m = pb.AttentionSpec(num_heads=self.num_heads, key_dim=self.key_dim,
                             value_dim=self.value_dim, feature_map=self.feature_map,
                             unnormalized=self.unnormalized, decay=self.decay,
                             feature_dim=self.feature_dim, seed=self.seed, horizon=self.horizon)
        if self.epsilon is not None:
            m.epsilon = self.epsilon
        if self.rule not in ("", "linear"):
            m.rule, m.gate, m.qk_l2norm, m.scale = (self.rule, self.gate, self.qk_l2norm,
                                                    self.scale)
            m.bonus.extend(self.bonus)
            if self.feature_map == "elu1" and not self.unnormalized:
                m.feature_map = ""  # the rule's own: identity, unnormalised
        return m

    @classmethod
    def from_proto(cls, m):
        return cls(num_heads=m.num_heads, key_dim=m.key_dim, value_dim=m.value_dim,
                   feature_map=m.feature_map or "elu1", unnormalized=m.unnormalized,
                   epsilon=m.epsilon if m.HasField("epsilon") else None,
                   decay=tuple(m.decay), feature_dim=m.feature_dim, seed=m.seed,
                   horizon=m.horizon, rule=m.rule or "linear", gate=m.gate,
                   qk_l2norm=m.qk_l2norm, scale=m.scale, bonus=tuple(m.bonus))


@dataclasses.dataclass(frozen=True)
class SessionInfo:
    """A session as the server describes it (proto Session).

    spec is the spec as the server resolved it (epsilon set); position the
    tokens consumed; state_bytes the exact size of its state (independent
    of position); feature_dim d_φ; idle_ms the time since it was last used.
    """
    id: str
    spec: AttentionSpec
    position: int
    state_bytes: int
    feature_dim: int
    idle_ms: int

    @classmethod
    def from_proto(cls, m):
        return cls(id=m.session_id, spec=AttentionSpec.from_proto(m.spec), position=m.position,
                   state_bytes=m.state_bytes, feature_dim=m.feature_dim, idle_ms=m.idle_ms)


@dataclasses.dataclass(frozen=True)
class AttentionOutput:
    """What decode and prefill return.

    output: y, (tokens, num_heads, value_dim) or (num_heads, value_dim);
    NaN where unavailable. denominator: φ(q)ᵀz without ε, (tokens,
    num_heads) or (num_heads,). available: False where the denominator was
    zero with ε = 0. position: the session's position after the request.
    """
    output: np.ndarray
    denominator: np.ndarray
    available: np.ndarray
    position: int


@dataclasses.dataclass(frozen=True)
class SessionState:
    """A session's state as stored (Inspect).

    s: (num_heads, d_φ, value_dim); z: (num_heads, d_φ), None for the gated
    and delta rules (which keep S alone). For FAVOR+ the true
    sums are exp(key_log_scale[h]) times s[h] and z[h]; key_log_scale is None
    for the other feature maps.
    """
    s: np.ndarray
    z: np.ndarray
    position: int
    key_log_scale: Optional[np.ndarray]
    info: SessionInfo


def _tokens(name, x, heads, dim, q_shape=None):
    """x as a float32 (tokens, heads, dim) array, and whether it was one
    token given as (heads, dim)."""
    a = np.asarray(x, dtype=np.float32)
    shape = a.shape
    single = a.ndim == 2
    if single:
        a = a[np.newaxis]
    if a.ndim != 3 or a.shape[1:] != (heads, dim):
        raise errors.error(grpc.StatusCode.INVALID_ARGUMENT,
                           f"{name}: expected shape (tokens, {heads}, {dim}) or "
                           f"({heads}, {dim}), got {shape}")
    if q_shape is not None and shape[:-1] != q_shape[:-1]:
        raise errors.error(grpc.StatusCode.INVALID_ARGUMENT,
                           f"{name}: shape {shape} has other tokens than q's {q_shape}")
    return a, single


def _inputs(spec, q, k, v):
    q_shape = np.shape(q)
    q, single = _tokens("q", q, spec.num_heads, spec.key_dim)
    k, _ = _tokens("k", k, spec.num_heads, spec.key_dim, q_shape)
    v, _ = _tokens("v", v, spec.num_heads, spec.value_dim, q_shape)
    return q, k, v, single


def _rule_inputs(spec, tokens, single, g, beta, a=None, b=None):
    """g, β, a and b as float32 arrays of (tokens, heads[, key_dim]),
    (tokens, heads) and (tokens, heads, key_dim), or None where not given;
    their sizes are the server's to check against the rule (it names the
    field)."""
    def shaped(x):
        if x is None:
            return None
        arr = np.asarray(x, dtype=np.float32)
        return arr[np.newaxis] if single else arr
    return shaped(g), shaped(beta), shaped(a), shaped(b)


def _output(spec, tokens, resp, single):
    H, dv = spec.num_heads, spec.value_dim
    out = AttentionOutput(output=_rpc.tensor(resp, "output", (tokens, H, dv)),
                          denominator=_rpc.tensor(resp, "denominator", (tokens, H)),
                          available=_rpc.bools(resp.available, (tokens, H)),
                          position=resp.position)
    if single:
        out = AttentionOutput(out.output[0], out.denominator[0], out.available[0], out.position)
    return out


def _decode_request(session_id, q, k, v, expected_position=None, g=None, beta=None,
                    a=None, b=None):
    req = pb.DecodeRequest(session_id=session_id)
    _rpc.set_tensor(req, "q", q)
    _rpc.set_tensor(req, "k", k)
    _rpc.set_tensor(req, "v", v)
    for name, x in (("g", g), ("beta", beta), ("a", a), ("b", b)):
        if x is not None:
            _rpc.set_tensor(req, name, x)
    if expected_position is not None:
        req.expected_position = expected_position
    return req


class Session(_rpc.SessionHandle):
    """An attention session on the server.

    Attributes: id, spec (as the server resolved it), feature_dim (d_φ),
    state_bytes, and position (as of the last reply this object saw; info()
    asks the server).

    As a context manager the session is deleted on exit:

        with client.create_session(num_heads=4, key_dim=16, value_dim=16) as s:
            y = s.decode(q, k, v).output
    """

    def __init__(self, client, info):
        super().__init__(client, info)
        self.spec = info.spec
        self.feature_dim = info.feature_dim

    def __repr__(self):
        return f"<linattn_client.Session {self.id} position={self.position} spec={self.spec}>"

    @property
    def _stub(self):
        return self._client.attention_stub

    def info(self):
        """The session as the server sees it now (GetSession): a SessionInfo."""
        info = SessionInfo.from_proto(self._call(self._stub.GetSession,
                                                 pb.GetSessionRequest(session_id=self.id)))
        self.position = info.position
        return info

    def decode(self, q, k, v, *, g=None, beta=None, a=None, b=None,
               expected_position=None):
        """Steps the session through one token ((heads, dim) arrays) or
        several ((tokens, heads, dim)), one Decode message each on one stream;
        returns an AttentionOutput of the same leading shape. The gated,
        delta, rwkv7 and rwkv6 rules also take g ((heads,), or (heads,
        key_dim) with gate "key"; a tokens axis first for several), beta
        ((heads,)), and a and b ((heads, key_dim) each; rwkv7).

        expected_position: the position the first token must follow; the
        server refuses the step (FailedPrecondition) if the session stands
        elsewhere, so a step resent after an UNAVAILABLE is never applied
        twice.

        Tokens are applied one by one: if token i is refused, tokens before
        it stay applied (self.position says how far it got) and none after
        it is. prefill() is all or nothing.
        """
        _inputs(self.spec, q, k, v)  # a bad shape opens no stream
        with Decoder(self, self._client.timeout) as decoder:
            return decoder.decode(q, k, v, g=g, beta=beta, a=a, b=b,
                                  expected_position=expected_position)

    def decoder(self, *, timeout=None):
        """A Decode stream kept open for many calls (a context manager):

            with session.decoder() as d:
                for t in range(T):
                    y = d.decode(q[t], k[t], v[t]).output

        saves opening a stream per step. timeout bounds the whole stream
        (default: none)."""
        return Decoder(self, timeout)

    def prefill(self, q, k, v, *, g=None, beta=None, a=None, b=None,
                shared_memory=False):
        """Runs a whole sequence at once through the chunkwise path (one
        Prefill request, all of it or none). Shapes as decode.

        shared_memory: the arrays go through a sealed memfd of this
        process's that the server reads and writes, none of them through
        the socket (a server started with --shared-memory, reached as
        unix:PATH; docs/design.md, "Shared-memory tensors")."""
        q, k, v, single = _inputs(self.spec, q, k, v)
        g, beta, a, b = _rule_inputs(self.spec, q.shape[0], single, g, beta, a, b)
        if shared_memory:
            return self._prefill_shared(q, k, v, g, beta, a, b, single)
        req = pb.PrefillRequest(session_id=self.id, tokens=q.shape[0])
        _rpc.set_tensor(req, "q", q)
        _rpc.set_tensor(req, "k", k)
        _rpc.set_tensor(req, "v", v)
        for name, x in (("g", g), ("beta", beta), ("a", a), ("b", b)):
            if x is not None:
                _rpc.set_tensor(req, name, x)
        resp = self._call(self._stub.Prefill, req)
        self.position = resp.position
        return _output(self.spec, q.shape[0], resp, single)

    def _prefill_shared(self, q, k, v, g, beta, a, b, single):
        T, H, dv = q.shape[0], self.spec.num_heads, self.spec.value_dim
        # The server reads what the offsets name, so the shapes are checked
        # here: a g, beta, a or b of another shape would read other tensors'
        # bytes.
        rule = self.spec.rule or "linear"
        g_shape = ((T, H, self.spec.key_dim) if self.spec.gate == "key" else (T, H)) \
            if rule in ("gated", "gated_delta", "rwkv7", "rwkv6") else None
        beta_shape = (T, H) if rule in ("delta", "gated_delta") else None
        ab_shape = (T, H, self.spec.key_dim) if rule == "rwkv7" else None
        for name, x, shape, what in (("g", g, g_shape, "log-gates"),
                                     ("beta", beta, beta_shape, "beta"),
                                     ("a", a, ab_shape, "a"),
                                     ("b", b, ab_shape, "b")):
            if shape is None and x is not None:
                raise errors.error(grpc.StatusCode.INVALID_ARGUMENT,
                                   f"{name}: rule {rule} takes no {what}")
            if shape is not None and (x is None or x.shape != shape):
                raise errors.error(grpc.StatusCode.INVALID_ARGUMENT,
                                   f"{name}: rule {rule} takes {what} of shape {shape}, got "
                                   f"{None if x is None else x.shape}")
        arrays = {"q": q, "k": k, "v": v, "g": g, "beta": beta, "a": a, "b": b}
        outputs = {"output": (T, H, dv), "denominator": (T, H)}
        offsets, nbytes = _shared_memory.layout(arrays, outputs)
        with _shared_memory.Region(nbytes) as region:
            tensors = pb.SharedMemoryTensors(path=region.path)
            for name, x in arrays.items():
                if x is not None:
                    region.view(offsets[name], x.shape)[...] = x
                    setattr(tensors, name + "_offset", offsets[name])
            tensors.output_offset = offsets["output"]
            tensors.denominator_offset = offsets["denominator"]
            req = pb.PrefillRequest(session_id=self.id, tokens=T, shared_memory=tensors)
            resp = self._call(self._stub.Prefill, req)
            if resp.output_bytes:  # the region took no write: they came back
                output = _rpc.tensor(resp, "output", outputs["output"])
                denominator = _rpc.tensor(resp, "denominator", outputs["denominator"])
            else:
                output = region.view(offsets["output"], outputs["output"]).copy()
                denominator = region.view(offsets["denominator"],
                                          outputs["denominator"]).copy()
        self.position = resp.position
        out = AttentionOutput(output=output, denominator=denominator,
                              available=_rpc.bools(resp.available, (T, H)),
                              position=resp.position)
        if single:
            out = AttentionOutput(out.output[0], out.denominator[0], out.available[0],
                                  out.position)
        return out

    def inspect(self):
        """The stored state: a SessionState with S (heads, d_φ, value_dim) and
        z (heads, d_φ) as numpy arrays."""
        resp = self._call(self._stub.Inspect, pb.InspectRequest(session_id=self.id))
        info = SessionInfo.from_proto(resp.session)
        H, dphi, dv = info.spec.num_heads, info.feature_dim, info.spec.value_dim
        self.position = resp.position
        z = _rpc.floats(resp.z, (H, dphi)) if len(resp.z) else None
        return SessionState(s=_rpc.floats(resp.s, (H, dphi, dv)), z=z,
                            position=resp.position,
                            key_log_scale=(_rpc.floats(resp.key_log_scale, (H,))
                                           if len(resp.key_log_scale) else None),
                            info=info)

    def snapshot(self):
        """The session (spec, position, state) as a versioned, checksummed
        blob: bytes for Client.restore_session."""
        return self._call(self._stub.Snapshot, pb.SnapshotRequest(session_id=self.id)).state

    def fork(self, session_id=None):
        """A new session with a copy of this one's state, evolving on its own
        from here. session_id: optional (1–128 of [A-Za-z0-9._-]); default a
        random one."""
        resp = self._call(self._stub.Fork, pb.ForkRequest(
            session_id=self.id, new_session_id=session_id or _rpc.new_session_id()))
        return Session(self._client, SessionInfo.from_proto(resp))

    def delete(self):
        """Deletes the session (NotFound if it is gone already)."""
        self._delete(self._stub.DeleteSession, pb.DeleteSessionRequest(session_id=self.id))


class Decoder:
    """One Decode stream of a session (Session.decoder()): each decode()
    sends its tokens on the open stream and reads their replies. Close it
    (or use it as a context manager) to end the stream. After an error the
    stream is over; open another (the session stays usable)."""

    def __init__(self, session, timeout=None):
        self._session = session
        self._requests = queue.SimpleQueue()
        self._closed = False
        self._call = session._stub.Decode(iter(self._requests.get, _END), timeout=timeout,
                                          metadata=_rpc.metadata(session.id))

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.cancel()

    def __del__(self):
        try:
            self.cancel()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def decode(self, q, k, v, *, g=None, beta=None, a=None, b=None,
               expected_position=None):
        """As Session.decode, on this stream."""
        if self._closed:
            raise ValueError("this Decoder is closed")
        session = self._session
        q, k, v, single = _inputs(session.spec, q, k, v)
        g, beta, a, b = _rule_inputs(session.spec, q.shape[0], single, g, beta, a, b)
        T, H, dv = q.shape[0], session.spec.num_heads, session.spec.value_dim
        for t in range(T):
            self._requests.put(_decode_request(
                session.id, q[t], k[t], v[t],
                None if expected_position is None else expected_position + t,
                None if g is None else g[t], None if beta is None else beta[t],
                None if a is None else a[t], None if b is None else b[t]))
        output = np.empty((T, H, dv), dtype=np.float32)
        denominator = np.empty((T, H), dtype=np.float32)
        available = np.empty((T, H), dtype=bool)
        for t in range(T):
            try:
                resp = next(self._call)
            except grpc.RpcError as e:
                self._end()
                raise errors.from_rpc_error(e) from e
            except StopIteration:
                self._end()
                raise errors.error(grpc.StatusCode.UNKNOWN,
                                   "the Decode stream ended before answering every token") from None
            output[t] = _rpc.tensor(resp, "output", (H, dv))
            denominator[t] = _rpc.tensor(resp, "denominator", (H,))
            available[t] = _rpc.bools(resp.available, (H,))
            session.position = resp.position
        if single:
            return AttentionOutput(output[0], denominator[0], available[0], session.position)
        return AttentionOutput(output, denominator, available, session.position)

    def _end(self):
        if not self._closed:
            self._closed = True
            self._requests.put(_END)  # releases the thread that sends requests

    def close(self):
        """Ends the stream (half-close) and waits for the server's status."""
        if self._closed:
            return
        self._end()
        try:
            for _ in self._call:
                pass
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from e

    def cancel(self):
        """Ends the stream at once."""
        self._end()
        self._call.cancel()
