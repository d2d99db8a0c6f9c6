"""Argument checks shared by the configs, the cache and the kernels.

Each raises ValueError naming the parameter, the value and what is allowed. Pure Python: importing
this module costs nothing.
"""

HEAD_DIMS = (64, 80, 96, 112, 128, 256)
MAX_BLOCK_SIZE = 256


def check_positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r}: must be an integer >= 1")


def check_block_size(block_size) -> None:
    if (
        isinstance(block_size, bool)
        or not isinstance(block_size, int)
        or not 1 <= block_size <= MAX_BLOCK_SIZE
        or block_size & (block_size - 1)
    ):
        raise ValueError(
            f"block_size={block_size!r}: must be a power of two in [1, {MAX_BLOCK_SIZE}]"
        )


def check_head_dim(head_dim) -> None:
    if isinstance(head_dim, bool) or head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim={head_dim!r}: must be one of {HEAD_DIMS}")


def check_num_heads(num_qo_heads, num_kv_heads) -> None:
    check_positive_int("num_qo_heads", num_qo_heads)
    check_positive_int("num_kv_heads", num_kv_heads)
    if num_qo_heads % num_kv_heads:
        raise ValueError(
            f"num_qo_heads={num_qo_heads}: must be divisible by num_kv_heads={num_kv_heads}"
        )
