"""Decode kernels: CUDA C loaders and wrappers, and a Numba kernel.

FAMILIES names the CUDA C kernel families (`kvlab.kernels.decode` maps each to its launcher);
`kernel="auto"` picks one of them. Importing this package loads nothing heavy.
"""

FAMILIES = ("vllm_v1", "gqa")
KERNELS = ("auto", *FAMILIES)
