"""linattn's generated protobuf and gRPC modules, for calls the wrappers do
not cover.

    from linattn_client.proto import attention_pb2, attention_pb2_grpc
    stub = attention_pb2_grpc.AttentionServiceStub(client.channel)

The modules are generated from proto/ when the package is built (see
build_protos.py) and live under linattn_client._proto; they import as
linattn_client._proto.linattn.v1.* and linattn_client._proto.grpc_health.v1.*,
never as top-level `linattn` or `grpc` modules.
"""
try:
    from linattn_client._proto.grpc_health.v1 import health_pb2, health_pb2_grpc
    from linattn_client._proto.linattn.v1 import (attention_pb2, attention_pb2_grpc,
                                                  generation_pb2, generation_pb2_grpc)
except ImportError as e:  # pragma: no cover - depends on how the package was built
    if e.name is None or not e.name.startswith("linattn_client._proto"):
        raise
    raise ImportError(
        "linattn_client's generated modules are missing: install the package "
        "(pip install clients/python) or generate them for PYTHONPATH use with "
        "`python3 clients/python/build_protos.py`", name=e.name) from e

__all__ = ["attention_pb2", "attention_pb2_grpc", "generation_pb2", "generation_pb2_grpc",
           "health_pb2", "health_pb2_grpc"]
