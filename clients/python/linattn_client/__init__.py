"""A Python client for linattn-server's gRPC API.

    import numpy as np
    import linattn_client

    with linattn_client.Client("127.0.0.1:50051", timeout=30) as client:
        with client.create_session(num_heads=4, key_dim=16, value_dim=16) as s:
            q = k = v = np.random.rand(8, 4, 16).astype(np.float32)
            y = s.decode(q, k, v).output            # (8, 4, 16)
        with client.model_session() as m:
            for event in m.generate("In the beginning", max_tokens=20):
                print(event.text, end="")

Client: the channel (plaintext, TLS or mTLS, with an optional API key),
health (grpc.health.v1) and the calls that create or find sessions. Session (AttentionService): decode, prefill, inspect,
snapshot, fork. ModelSession (GenerationService): append, generate,
complete, snapshot, fork. Errors keep the gRPC status (linattn_client.errors).
The generated protobuf modules are in linattn_client.proto.
"""
from . import errors
from .attention import AttentionOutput, AttentionSpec, Decoder, Session, SessionInfo, SessionState
from .client import Client, HealthStatus
from .errors import (AlreadyExists, Cancelled, DataLoss, DeadlineExceeded, Error,
                     FailedPrecondition, InvalidArgument, NotFound, OutOfRange, ResourceExhausted,
                     Unauthenticated, Unavailable)
from .generation import (ModelInfo, ModelSession, ModelSessionInfo, TokenEvent, TokenStream,
                         Usage)

__version__ = "0.1.0"

__all__ = [
    "Client", "HealthStatus",
    "AttentionSpec", "Session", "SessionInfo", "SessionState", "AttentionOutput", "Decoder",
    "ModelInfo", "ModelSession", "ModelSessionInfo", "TokenEvent", "TokenStream", "Usage",
    "errors", "Error", "Cancelled", "InvalidArgument", "DeadlineExceeded", "NotFound",
    "AlreadyExists", "ResourceExhausted", "FailedPrecondition", "OutOfRange", "DataLoss",
    "Unavailable", "Unauthenticated",
]
