"""Shared-memory tensors, the client's side (docs/design.md, "Shared-memory
tensors"): a Prefill's arrays in a sealed memfd of this process's, which a
server started with --shared-memory on a unix socket reads and writes
instead of carrying them in messages."""
import fcntl
import mmap
import os

import numpy as np

_F32 = np.dtype("<f4")


class Region:
    """A memfd named linattn-python of `nbytes`, allocated and sealed
    against shrinking and growing, mapped here; path is what the server opens. A context
    manager (closed on exit); arrays handed out by view() must be dropped
    before it closes."""

    def __init__(self, nbytes):
        self.fd = os.memfd_create("linattn-python", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, nbytes)
            # Every page allocated now: the server writes outputs only into
            # memory the client already has.
            os.posix_fallocate(self.fd, 0, nbytes)
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
            self.map = mmap.mmap(self.fd, nbytes)
        except BaseException:
            os.close(self.fd)
            raise
        self.path = f"/proc/{os.getpid()}/fd/{self.fd}"

    def view(self, offset, shape):
        """The float32 array of `shape` at byte `offset` (no copy)."""
        count = int(np.prod(shape))
        return np.frombuffer(self.map, dtype=_F32, count=count, offset=offset).reshape(shape)

    def close(self):
        try:
            self.map.close()
        finally:
            os.close(self.fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def layout(arrays, outputs):
    """Byte offsets of `arrays` (name → array or None) and then `outputs`
    (name → shape) one after another, and the total."""
    offsets, at = {}, 0
    for name, a in arrays.items():
        if a is not None:
            offsets[name] = at
            at += a.size * 4
    for name, shape in outputs.items():
        offsets[name] = at
        at += int(np.prod(shape)) * 4
    return offsets, at
