"""The descriptor pool of linattn_client's generated modules.

build_protos.py points the generated *_pb2 modules here instead of
protobuf's default pool, so the package's copies of the schemas
(linattn/v1/*.proto, grpc_health/v1/health.proto) never collide with other
code generated from the same files, or from other versions of them, that the
same process imports.
"""
from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
