"""The plain read (kernels/read_bytes.cu): sizes checked before anything is allocated (CPU); on
the GPU, every 16-byte word read exactly once, whatever the size against the grid."""

import numpy as np
import pytest
import torch

from kvlab.kernels import green
from kvlab.kernels.read import CTAS_PER_SM, READ_THREADS, PlainRead


@pytest.mark.parametrize("num_bytes", [0, 8, 24, -16, 16.0, True, "64"])
def test_num_bytes_must_be_a_positive_multiple_of_16(num_bytes):
    with pytest.raises(ValueError, match=rf"num_bytes={num_bytes!r}: must be a positive "
                                         "multiple of 16"):
        PlainRead(num_bytes, device="cpu")


def buffer_xor(read: PlainRead) -> int:
    return int(np.bitwise_xor.reduce(read.src.cpu().numpy().view(np.uint32)))


@pytest.mark.gpu
@pytest.mark.parametrize("num_words", [
    1, 17, READ_THREADS + 1,  # fewer CTAs than the grid holds
    # a whole grid's stride x 4 (the unrolled loop only), then 7 words more (the tail loop too)
    "grid_x4", "grid_x4+7", "grid_x9+97"])
def test_every_word_is_read_once(num_words):
    grid = CTAS_PER_SM * green.device_sms() * READ_THREADS
    if isinstance(num_words, str):
        times, _, extra = num_words.removeprefix("grid_x").partition("+")
        num_words = grid * int(times) + int(extra or 0)
    read = PlainRead(16 * num_words)
    read.read()
    torch.cuda.synchronize()
    assert read.num_ctas == min(grid // READ_THREADS, -(-num_words // READ_THREADS))
    assert read.checksum() == buffer_xor(read)
    read.src[5] ^= 1  # one bit of one word changed: the checksum sees it
    read.read()
    assert read.checksum() == buffer_xor(read)


@pytest.mark.gpu
@pytest.mark.skipif(green.unavailable_reason() is not None, reason="no green contexts here")
def test_a_read_made_on_fewer_sms_launches_for_those():
    with green.sm_limit(32) as held:
        read = PlainRead(2**26)
        read.read()
        torch.cuda.synchronize()
    assert read.num_ctas == CTAS_PER_SM * held
    assert read.checksum() == buffer_xor(read)
