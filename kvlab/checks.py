"""Argument checks shared by the configs, the cache and the kernels.

Each raises ValueError naming the parameter, the value and what is allowed. Pure Python: importing
this module costs nothing.
"""

import math
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


def is_real(value) -> bool:
    """True for a finite real number: a Python or numpy int or float, but not a bool (nor NaN, an
    infinity or an int past the float range). A caller that keeps the value stores
    `float(value)`."""
    # (numpy's bool is not a numbers.Real)
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int past float's range
        return False


def check_int(name: str, value, minimum: int, maximum: int | None = None) -> None:
    """ValueError unless `value` is an integer (is_int) in [minimum, maximum]."""
    if not is_int(value) or value < minimum or (maximum is not None and value > maximum):
        allowed = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{name}={value!r}: must be an integer {allowed}")


def check_real(name: str, value, minimum: float | None = None, maximum: float | None = None, *,
               open_min: bool = False) -> None:
    """ValueError unless `value` is a finite real number (is_real) >= minimum (> minimum with
    open_min) and <= maximum, where given."""
    ok = is_real(value)  # NOTE: first: a str or None must not reach the comparisons
    if ok and minimum is not None:
        ok = value > minimum if open_min else value >= minimum
    if ok and maximum is not None:
        ok = value <= maximum
    if not ok:
        bounds = [f"{'>' if open_min else '>='} {minimum}"] if minimum is not None else []
        bounds += [f"<= {maximum}"] if maximum is not None else []
        raise ValueError(f"{name}={value!r}: must be a finite number"
                         + (f" {' and '.join(bounds)}" if bounds else ""))


def check_bool(name: str, value) -> None:
    """ValueError unless `value` is True or False (a numpy bool too)."""
    numpy_bool = type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_")
    if not (value is True or value is False or numpy_bool):
        raise ValueError(f"{name}={value!r}: must be True or False")


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
