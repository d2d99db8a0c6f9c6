"""kvlab.checks: the shared argument checks accept numpy scalars and refuse the rest by name."""

import numpy as np
import pytest

from kvlab.checks import check_bool, check_int, check_real, is_int, is_real


@pytest.mark.parametrize("value", [3, np.int64(3), 2.5, np.float32(0.7), np.float64(-1e300)])
def test_is_real_accepts_numbers_of_python_and_numpy(value):
    assert is_real(value)


@pytest.mark.parametrize("value", [True, np.bool_(True), float("nan"), float("inf"), "1", None,
                                   [1], 1j, 10**400, -(10**400)])
def test_is_real_refuses_bools_non_finite_and_non_numbers(value):
    assert not is_real(value)


@pytest.mark.parametrize("value", ["x", None, [1], True, float("nan"), -1, 2])
def test_check_real_names_the_parameter_for_anything_outside_its_range(value):
    with pytest.raises(ValueError, match=r"^top_p=.*: must be a finite number > 0 and <= 1$"):
        check_real("top_p", value, 0, 1, open_min=True)


def test_check_real_bounds_are_inclusive_unless_open():
    check_real("x", 0, 0)
    check_real("x", 1, 0, 1)
    with pytest.raises(ValueError, match=r"x=0: must be a finite number > 0"):
        check_real("x", 0, 0, open_min=True)


@pytest.mark.parametrize("value", [0, 8, np.int32(8)])
def test_check_int_takes_python_and_numpy_integers_in_range(value):
    check_int("n", value, 0, 8)


@pytest.mark.parametrize("value", [-1, 9, 8.0, True, "8", 2**70])
def test_check_int_refuses_outside_the_range_or_not_an_integer(value):
    with pytest.raises(ValueError, match=r"^n=.*: must be an integer in \[0, 8\]$"):
        check_int("n", value, 0, 8)
    assert not is_int(True)


@pytest.mark.parametrize("value", [1, 0, "no", None])
def test_check_bool_refuses_anything_but_a_bool(value):
    with pytest.raises(ValueError, match=r"ignore_eos=.*: must be True or False"):
        check_bool("ignore_eos", value)
    check_bool("ignore_eos", np.bool_(False))
