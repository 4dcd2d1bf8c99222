#!/usr/bin/python3
"""Generates linattn_client's protobuf and gRPC modules from proto/.

setup.py calls generate() while it builds the package (pip install), so an
installed linattn_client always carries modules made from the schemas beside
it. Run directly, this script makes a copy of the package usable through
PYTHONPATH, without installing anything:

    /usr/bin/python3 clients/python/build_protos.py            # in place
    PYTHONPATH=clients/python /usr/bin/python3 -c 'import linattn_client'

    /usr/bin/python3 clients/python/build_protos.py --out DIR  # a copy
    PYTHONPATH=DIR /usr/bin/python3 -c 'import linattn_client'

Every .proto under the schema directory (the repository's proto/, or
$LINATTN_PROTO_DIR) is compiled with protoc --python_out and
grpc_python_plugin (Debian: protobuf-compiler, protobuf-compiler-grpc) into
linattn_client/_proto/, keeping the schemas' own paths:

    linattn_client/_proto/linattn/v1/attention_pb2.py, ..._pb2_grpc.py
    linattn_client/_proto/linattn/v1/generation_pb2.py, ...
    linattn_client/_proto/grpc_health/v1/health_pb2.py, ...

The generated code is then rewritten so that it lives only in that
namespace:

- `from linattn.v1 import attention_pb2` becomes
  `from linattn_client._proto.linattn.v1 import attention_pb2` (and the same
  for grpc_health), so no top-level `linattn` or `grpc_health` module is ever
  needed or created, and grpcio's `grpc` package stays the one imported;
- the message classes' module name is the module's real name;
- the descriptors go into linattn_client's own descriptor pool
  (linattn_client/_pool.py) instead of protobuf's default one, so the
  package coexists with any other code generated from the same or an older
  copy of these schemas (or grpcio-health-checking's health.proto) in one
  process.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = "linattn_client"
SUBPACKAGE = "_proto"
PACKAGE_DIR = os.path.join(HERE, PACKAGE)

_POOL_IMPORT = "from google.protobuf import descriptor_pool as _descriptor_pool\n"


class ProtoBuildError(RuntimeError):
    """The modules could not be generated (a tool or a schema is missing)."""


def find_proto_root():
    """The directory holding linattn/v1/*.proto: $LINATTN_PROTO_DIR, else the
    repository's proto/ (../../proto from here)."""
    env = os.environ.get("LINATTN_PROTO_DIR")
    candidates = [env] if env else [os.path.join(HERE, "..", "..", "proto")]
    for candidate in candidates:
        if os.path.isfile(os.path.join(candidate, "linattn", "v1", "attention.proto")):
            return os.path.normpath(os.path.abspath(candidate))
    raise ProtoBuildError(
        f"no linattn schemas at {', '.join(os.path.abspath(c) for c in candidates)} "
        "(expected linattn/v1/attention.proto there): build from a checkout of the "
        "repository, or set LINATTN_PROTO_DIR to its proto/ directory")


def _tool(name, package):
    path = shutil.which(name)
    if path is None:
        raise ProtoBuildError(f"{name} not found on PATH (Debian package {package})")
    return path


def rewrite(source, top_names, module_name):
    """Generated code of one module, moved under linattn_client._proto."""
    alts = "|".join(re.escape(n) for n in sorted(top_names))
    prefix = f"{PACKAGE}.{SUBPACKAGE}."
    source = re.sub(rf"^from ((?:{alts})(?:\.\w+)*) import ",
                    lambda m: f"from {prefix}{m.group(1)} import ", source, flags=re.M)
    source = re.sub(rf"(BuildTopDescriptorsAndMessages\(DESCRIPTOR, )'((?:{alts})\.[\w.]+)'",
                    lambda m: f"{m.group(1)}'{prefix}{m.group(2)}'", source)
    if "_descriptor_pool.Default()" in source:
        if _POOL_IMPORT not in source:
            raise ProtoBuildError(f"{module_name}: unexpected generated code (no descriptor_pool import)")
        source = source.replace(
            _POOL_IMPORT, _POOL_IMPORT + f"from {PACKAGE} import _pool as _linattn_pool\n", 1)
        source = source.replace("_descriptor_pool.Default()", "_linattn_pool.POOL")
    # Nothing may still import a top-level module of the schemas' names, or
    # use protobuf's default pool.
    left = re.search(rf"^\s*(?:from|import)\s+(?:{alts})\b.*$", source, flags=re.M)
    if left:
        raise ProtoBuildError(f"{module_name}: could not rewrite {left.group(0).strip()!r}")
    if "_descriptor_pool.Default()" in source:
        raise ProtoBuildError(f"{module_name}: still uses protobuf's default descriptor pool")
    return source


def generate(package_dir=PACKAGE_DIR, proto_root=None, verbose=False):
    """Writes package_dir/_proto/ (replacing what was there); returns the
    paths written."""
    proto_root = proto_root or find_proto_root()
    protoc = _tool("protoc", "protobuf-compiler")
    plugin = _tool("grpc_python_plugin", "protobuf-compiler-grpc")
    protos = sorted(os.path.relpath(p, proto_root) for p in
                    glob.glob(os.path.join(proto_root, "**", "*.proto"), recursive=True))
    if not protos:
        raise ProtoBuildError(f"no .proto files under {proto_root}")
    with tempfile.TemporaryDirectory(prefix="linattn_client_proto_") as tmp:
        out = os.path.join(tmp, SUBPACKAGE)
        os.makedirs(out)
        cmd = [protoc, f"--proto_path={proto_root}", f"--python_out={out}",
               f"--grpc_out={out}", f"--plugin=protoc-gen-grpc={plugin}", *protos]
        if verbose:
            print(" ".join(cmd), file=sys.stderr)
        result = subprocess.run(cmd, cwd=proto_root, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        if result.returncode != 0:
            raise ProtoBuildError(f"protoc failed ({result.returncode}):\n{result.stdout}")
        top_names = {e for e in os.listdir(out) if os.path.isdir(os.path.join(out, e))}
        if top_names & {"grpc", "google", PACKAGE}:
            raise ProtoBuildError(
                f"a schema's path would make {sorted(top_names & {'grpc', 'google', PACKAGE})} "
                "modules; keep schemas out of grpc/ and google/")
        for dirpath, _, filenames in os.walk(out):
            rel = os.path.relpath(dirpath, out)
            package = ".".join([PACKAGE, SUBPACKAGE] + ([] if rel == "." else rel.split(os.sep)))
            for name in filenames:
                if not name.endswith(".py"):
                    continue
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8") as f:
                    source = f.read()
                source = rewrite(source, top_names, f"{package}.{name[:-3]}")
                with open(path, "w", encoding="utf-8") as f:
                    f.write(source)
            with open(os.path.join(dirpath, "__init__.py"), "w", encoding="utf-8") as f:
                f.write('"""Generated by clients/python/build_protos.py; do not edit."""\n')
        dest = os.path.join(package_dir, SUBPACKAGE)
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(out, dest)
    written = []
    for dirpath, _, filenames in os.walk(dest):
        written += [os.path.join(dirpath, n) for n in sorted(filenames)]
    return written


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write a complete copy of the package into OUT/"
                        f"{PACKAGE} (default: generate in place, in {PACKAGE_DIR})")
    parser.add_argument("--proto-dir", help="the schema directory (default: "
                        "$LINATTN_PROTO_DIR, else the repository's proto/)")
    args = parser.parse_args(argv)
    target = PACKAGE_DIR
    if args.out:
        target = os.path.join(os.path.abspath(args.out), PACKAGE)
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(PACKAGE_DIR, target,
                        ignore=shutil.ignore_patterns(SUBPACKAGE, "__pycache__"))
    try:
        written = generate(target, args.proto_dir and os.path.abspath(args.proto_dir))
    except ProtoBuildError as e:
        print(f"build_protos: {e}", file=sys.stderr)
        return 1
    print(f"build_protos: {len(written)} files in {os.path.join(target, SUBPACKAGE)}")
    if args.out:
        print(f"use with PYTHONPATH={os.path.abspath(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
