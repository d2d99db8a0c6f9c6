"""Argument checks shared by the configs, the cache and the kernels.

Each raises ValueError naming the parameter, the value and what is allowed. Pure Python: importing
this module costs nothing.
"""

import numbers

HEAD_DIMS = (64, 80, 96, 112, 128, 256)
MAX_BLOCK_SIZE = 256


def is_int(value) -> bool:
    """True for an integer: a Python int or a numpy integer (numbers.Integral), but not a bool.

    Floats are not integers here, even integral-valued ones such as 3.0. A caller that keeps the
    value stores `int(value)`, so that numpy integers do not leak into its state.
    """
    # NOTE: the plain-int test first: the ABC check costs ~10x more and sits on hot paths.
    return type(value) is int or (
        isinstance(value, numbers.Integral) and not isinstance(value, bool)
    )


def check_int(name: str, value, minimum: int) -> None:
    if not is_int(value) or value < minimum:
        raise ValueError(f"{name}={value!r}: must be an integer >= {minimum}")


def check_positive_int(name: str, value) -> None:
    check_int(name, value, 1)


def check_block_size(block_size) -> None:
    if (
        not is_int(block_size)
        or not 1 <= block_size <= MAX_BLOCK_SIZE
        or block_size & (block_size - 1)
    ):
        raise ValueError(
            f"block_size={block_size!r}: must be a power of two in [1, {MAX_BLOCK_SIZE}]"
        )


def check_head_dim(head_dim) -> None:
    if not is_int(head_dim) or head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim={head_dim!r}: must be an integer, one of {HEAD_DIMS}")


def check_num_heads(num_qo_heads, num_kv_heads) -> None:
    check_positive_int("num_qo_heads", num_qo_heads)
    check_positive_int("num_kv_heads", num_kv_heads)
    if num_qo_heads % num_kv_heads:
        raise ValueError(
            f"num_qo_heads={num_qo_heads}: must be divisible by num_kv_heads={num_kv_heads}"
        )
