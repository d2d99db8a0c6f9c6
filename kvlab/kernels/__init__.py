"""Decode kernels: CUDA C loaders and wrappers, and a Numba kernel.

KERNEL_FAMILIES (`kvlab.kernels.families`) is the one table of the CUDA C kernel families: each
one's layout, block sizes, groups, dtypes and launcher. FAMILIES are their names; `kernel="auto"`
picks one of them. Importing this package loads nothing heavy.
"""

from kvlab.kernels.families import FAMILIES, KERNEL_FAMILIES, KERNELS, KernelFamily

__all__ = ["FAMILIES", "KERNELS", "KERNEL_FAMILIES", "KernelFamily"]
