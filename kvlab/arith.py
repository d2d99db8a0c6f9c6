"""Integer arithmetic shared by every floor of kvlab. Pure Python: importing it costs nothing."""


def ceil_div(a, b):
    """ceil(a / b), exactly (no float on the way): a and b integers, b > 0; numpy integer arrays
    too, element by element. Plain Python: Numba-compiled code cannot call it."""
    return -(-a // b)
