"""GenerationService: sessions of a language model, streaming generation.

A model session holds the running sums S and z of every layer and head, so
its memory never grows with the context. Sessions come from
linattn_client.Client (model_session, restore_model_session,
list_model_sessions); generate() streams TokenEvents, complete() returns the
text.
"""
import dataclasses
from typing import Optional, Tuple

import grpc

from . import _rpc, errors
from .proto import generation_pb2 as pb

__all__ = ["ModelInfo", "ModelSessionInfo", "Usage", "TokenEvent", "TokenStream",
           "ModelSession"]


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """A model the server serves (proto ModelInfo). state_bytes is the size
    of one session's state at an empty context (at any context length but
    for hybrids, whose softmax-attention layers in attention_layers add
    kv_bytes_per_token per position, up to kv_bytes_max when every such
    layer is windowed, else 0 = without bound); model_type is fla's
    (linear_attn, retnet, gla, delta_net, gated_deltanet, mamba2, rwkv7,
    rwkv6) and update_rule the state's rule (linear, gated, delta,
    gated_delta, rwkv7, rwkv6)."""
    name: str
    model_type: str
    feature_map: str
    normalized: bool
    num_layers: int
    num_heads: int
    num_kv_heads: int
    hidden_size: int
    vocab_size: int
    tokenizer: str
    parameters: int
    state_bytes: int
    fingerprint: str
    update_rule: str
    conv_window_floats: int
    kv_bytes_per_token: int = 0
    kv_bytes_max: int = 0
    attention_layers: Tuple[int, ...] = ()

    @classmethod
    def from_proto(cls, m):
        return cls(**{f.name: (tuple(getattr(m, f.name)) if f.name == "attention_layers"
                               else getattr(m, f.name))
                      for f in dataclasses.fields(cls)})


@dataclasses.dataclass(frozen=True)
class ModelSessionInfo:
    """A model session as the server describes it: position is the number of
    tokens in its context, state_bytes its state there (a hybrid's keys and
    values included)."""
    id: str
    model: str
    position: int
    state_bytes: int

    @classmethod
    def from_proto(cls, m):
        return cls(id=m.session_id, model=m.model, position=m.position, state_bytes=m.state_bytes)


@dataclasses.dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int


@dataclasses.dataclass(frozen=True)
class TokenEvent:
    """One message of a Generate stream.

    token_id: the token (None on a last message that carries none); text:
    its text, always complete UTF-8 (a character split across tokens comes
    with the token that completes it, text that could begin a stop string is
    held back, and bytes that are not UTF-8 come as U+FFFD — token_id keeps
    the raw byte); logprob: log_softmax of the token (None unless
    generate(logprobs=True)); finish_reason: None until the last message,
    then "length", "stop", "eos" or "cancelled"; position: the session's
    position after this token; usage: prompt and completion token counts,
    when the message carries them.
    """
    token_id: Optional[int]
    text: str
    logprob: Optional[float]
    finish_reason: Optional[str]
    position: int
    usage: Optional[Usage] = None


class TokenStream:
    """The TokenEvents of one Generate call, as an iterator.

    Stopping early cancels the call: close() it, leave a `with` block, or
    drop it (a `for` loop that breaks over a stream it holds no other
    reference to). The server then keeps in the context exactly the tokens
    whose messages it had sent — at least those delivered here, possibly one
    or two more in flight; Session.info().position tells. After the stream
    ends, finish_reason, usage, token_ids and text describe what came.
    """

    def __init__(self, session, call, logprobs):
        self._session = session
        self._call = call
        self._logprobs = logprobs
        self._done = False
        self.finish_reason = None
        self.usage = None
        self.token_ids = []
        self._text = []

    @property
    def text(self):
        """The text delivered so far."""
        return "".join(self._text)

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        try:
            m = next(self._call)
        except StopIteration:
            self._done = True
            raise
        except grpc.RpcError as e:
            self._done = True
            raise errors.from_rpc_error(e) from e
        event = TokenEvent(
            token_id=m.token_id if m.token_id >= 0 else None, text=m.text,
            logprob=m.logprob if self._logprobs and m.token_id >= 0 else None,
            finish_reason=m.finish_reason or None, position=m.position,
            usage=(Usage(m.usage.prompt_tokens, m.usage.completion_tokens)
                   if m.HasField("usage") else None))
        if event.token_id is not None:
            self.token_ids.append(event.token_id)
        self._text.append(event.text)
        if event.usage is not None:
            self.usage = event.usage
        if event.finish_reason:
            self.finish_reason = event.finish_reason
        self._session.position = m.position
        return event

    def close(self):
        """Cancels the call if it is still running (generation stops)."""
        if not self._done:
            self._done = True
            self._call.cancel()

    cancel = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class ModelSession(_rpc.SessionHandle):
    """A session of a model on the server.

    Attributes: id, model, state_bytes, and position (tokens in the context,
    as of the last reply this object saw; info() asks the server). As a
    context manager the session is deleted on exit:

        with client.model_session() as s:
            print(s.complete("In the beginning", max_tokens=32))
    """

    def __init__(self, client, info):
        super().__init__(client, info)
        self.model = info.model

    def __repr__(self):
        return f"<linattn_client.ModelSession {self.id} model={self.model!r} position={self.position}>"

    @property
    def _stub(self):
        return self._client.generation_stub

    def _update(self, m):
        info = ModelSessionInfo.from_proto(m)
        self.position = info.position
        return info

    def info(self):
        """The session as the server sees it now: a ModelSessionInfo."""
        return self._update(self._call(self._stub.GetSession,
                                       pb.GetModelSessionRequest(session_id=self.id)))

    def append(self, context):
        """Adds text (str) or token ids (a sequence of ints) to the context;
        returns the ModelSessionInfo after it."""
        req = pb.AppendRequest(session_id=self.id)
        if isinstance(context, str):
            req.text = context
        else:
            req.token_ids.extend(int(t) for t in context)
        return self._update(self._call(self._stub.Append, req))

    def generate(self, prompt="", *, max_tokens=16, temperature=0.0, top_p=1.0, top_k=0,
                 seed=0, stop=None, logprobs=False, resume_stream=False, timeout=None,
                 min_p=0.0, presence_penalty=0.0, frequency_penalty=0.0,
                 repetition_penalty=None, penalty_last_n=None):
        """Appends prompt (text, or a sequence of token ids; empty = continue
        the context), then streams the sampled tokens: a TokenStream of
        TokenEvents.

        temperature 0 is greedy; top_k 0 and top_p 1 are no limit; the same
        seed, model and context give the same tokens. max_tokens: 1 or more
        (the server reads 0 as 16). stop: a string or strings; generation
        ends before any of them and their text is not sent. logprobs: report
        each token's log-probability. resume_stream: continue the random
        stream of the session's last sampling generate (after a cut call).
        timeout: a deadline for the whole stream (default: the client's).
        min_p: keep tokens at least this times as likely as the most likely
        (0 = no limit). presence_penalty and frequency_penalty (OpenAI's, in
        [-2, 2]) act on the tokens this call has generated;
        repetition_penalty (llama.cpp's, None or 1 = none) on the last
        penalty_last_n (None = 64, -1 = all) tokens it feeds and makes.
        """
        if isinstance(stop, str):
            stop = [stop]
        sampling = pb.SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                                     max_tokens=max_tokens, stop=stop or (), logprobs=logprobs,
                                     resume_stream=resume_stream, min_p=min_p,
                                     presence_penalty=presence_penalty,
                                     frequency_penalty=frequency_penalty)
        if repetition_penalty is not None:
            sampling.repetition_penalty = repetition_penalty
        if penalty_last_n is not None:
            sampling.penalty_last_n = penalty_last_n
        req = pb.GenerateRequest(session_id=self.id, sampling=sampling)
        if isinstance(prompt, str):
            req.prompt = prompt
        else:
            req.prompt_token_ids.extend(int(t) for t in prompt)
        call = self._stub.Generate(req, timeout=self._client.timeout if timeout is None else timeout,
                                   metadata=_rpc.metadata(self.id))
        return TokenStream(self, call, logprobs)

    def complete(self, prompt="", **sampling):
        """generate(prompt, **sampling) to its end; returns the text."""
        with self.generate(prompt, **sampling) as stream:
            for _ in stream:
                pass
            return stream.text

    def fork(self, session_id=None):
        """A new session with a copy of this one's context."""
        return ModelSession(self._client, ModelSessionInfo.from_proto(self._call(
            self._stub.Fork, pb.ForkModelSessionRequest(
                session_id=self.id, new_session_id=session_id or _rpc.new_session_id()))))

    def snapshot(self):
        """The context (model name and fingerprint, state) as bytes for
        Client.restore_model_session; a server with another model refuses
        them."""
        return self._call(self._stub.Snapshot,
                          pb.SnapshotModelSessionRequest(session_id=self.id)).state

    def delete(self):
        """Deletes the session (NotFound if it is gone already); a generate
        still running on it is cancelled."""
        self._delete(self._stub.DeleteSession,
                     pb.DeleteModelSessionRequest(session_id=self.id))
