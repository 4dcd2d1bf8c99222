"""setuptools hook: generate linattn_client._proto while building.

Metadata is in pyproject.toml. build_py runs build_protos.generate() on the
package in the build directory (or, for an editable install, in the source
tree), compiling the repository's proto/ with protoc and grpc_python_plugin.
"""
import os
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import build_protos  # noqa: E402


class BuildPyWithProtos(build_py):
    """build_py, then the generated protobuf and gRPC modules."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            package_dir = build_protos.PACKAGE_DIR
        else:
            package_dir = os.path.join(self.build_lib, build_protos.PACKAGE)
        self.announce(f"generating {build_protos.PACKAGE}.{build_protos.SUBPACKAGE} "
                      f"in {package_dir}", level=2)
        if not self.dry_run:
            try:
                build_protos.generate(package_dir)
            except build_protos.ProtoBuildError as e:
                raise SystemExit(f"linattn-client: {e}") from e


setup(cmdclass={"build_py": BuildPyWithProtos})
