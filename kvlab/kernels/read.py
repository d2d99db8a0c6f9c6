"""A plain read of `num_bytes` on the GPU, each byte once (kernels/read_bytes.cu): the bound a
decode kernel reading the same bytes is measured against, at the size it reads.

A small read cannot reach HBM's full speed: its launch fills the SMs, and its end drains them,
in a time that a large read hides. `PlainRead` times what a read of that size can do, so that a
decode kernel at 1 x 32k is compared with what 134 MB can be read in, not with the copy roofline
of gigabytes (`kvlab.timing.copy_roofline_gbps`).
"""

import numpy as np
import torch

from kvlab.arith import ceil_div
from kvlab.checks import is_int
from kvlab.kernels import green
from kvlab.kernels.launch import launch
from kvlab.kernels.loader import load

SOURCE = "read_bytes.cu"
READ_THREADS = 512  # READ_THREADS in read_bytes.cu
CTAS_PER_SM = 4  # 2,048 threads an SM: every thread slot of a Hopper SM
WORD_BYTES = 16


def check_num_bytes(num_bytes) -> None:
    """ValueError unless `num_bytes` is a positive multiple of WORD_BYTES."""
    if not is_int(num_bytes) or num_bytes < WORD_BYTES or num_bytes % WORD_BYTES:
        raise ValueError(f"num_bytes={num_bytes!r}: must be a positive multiple of {WORD_BYTES}")


class PlainRead:
    """`read()` reads a buffer of `num_bytes` (random bytes on `device`) once, on torch's current
    stream, in CTAS_PER_SM CTAs an SM of those that stream may use when the read is made
    (`kvlab.kernels.green.current_sms`).

    num_bytes: a positive multiple of 16 (K and V rows always are). ValueError for that, or a
    device that is not a GPU, before anything is allocated."""

    def __init__(self, num_bytes: int, device="cuda"):
        check_num_bytes(num_bytes)
        self.device = torch.device(device)
        if self.device.type != "cuda":
            raise ValueError(f"device={device!r}: the read kernel needs a CUDA device")
        if self.device.index is None:
            self.device = torch.device(self.device.type, torch.cuda.current_device())
        self.num_bytes = int(num_bytes)
        # [num_bytes] uint8, read as [num_bytes / 16] uint4
        self.src = torch.empty(self.num_bytes, dtype=torch.uint8,
                               device=self.device).random_(0, 256)
        (self.kernel,) = load(SOURCE, ["read_bytes"], self.device.index)
        num_words = self.num_bytes // WORD_BYTES
        self.num_ctas = min(CTAS_PER_SM * green.current_sms(self.device),
                            ceil_div(num_words, READ_THREADS))
        # [num_ctas] int32 (uint32 in the kernel): the XOR of the words each CTA read
        self.sink = torch.zeros(self.num_ctas, dtype=torch.int32, device=self.device)
        self.args = (np.uint64(self.src.data_ptr()), np.int64(num_words),
                     np.uint64(self.sink.data_ptr()))

    def read(self) -> None:
        launch(self.kernel, (self.num_ctas,), (READ_THREADS,), self.args, self.device)

    def checksum(self) -> int:
        """The XOR of the 32-bit words the last `read()` read (its CTAs' XORs combined): that of
        the whole buffer where every word was read once."""
        return int(np.bitwise_xor.reduce(self.sink.cpu().numpy().view(np.uint32)))
