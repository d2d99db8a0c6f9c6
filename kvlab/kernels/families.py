"""The decode kernel families, one row each: what a family reads and takes, and where its
launcher lives. Every other place (the launchers, `DecodePlan`'s checks, the engine's cache
layout, the bench, the L2 model, the predictor, the panels) reads this table, so a new family
is one row here, a `.cu` file in `kernels/` and a launcher module.

Pure Python: the launcher is named by its dotted path and imported on first use, so importing
this module loads neither torch nor CuPy.
"""

from dataclasses import dataclass
from importlib import import_module

from kvlab.checks import HEAD_DIMS


@dataclass(frozen=True)
class KernelFamily:
    """One family of CUDA C decode kernels.

    name: its key in KERNEL_FAMILIES (the `kernel=` value). source: its file in `kernels/`.
    launcher: the dotted path of its launcher class (`module.Class`), imported on first use.
    layout: the cache layout it reads (kvlab.cache.paged_cache.LAYOUTS). block_sizes: the
    tokens a block it takes. max_group: query heads a KV head, at most (None: any).
    head_dims: the head dims it is built for. cache_dtypes: the caches it reads ("float16",
    "bfloat16", "fp8": float8_e4m3fn, dequantised in registers).
    """

    name: str
    source: str
    launcher: str
    layout: str
    block_sizes: tuple[int, ...]
    max_group: int | None
    head_dims: tuple[int, ...]
    cache_dtypes: tuple[str, ...]

    @property
    def module(self):
        """The launcher's module (its `name_expressions`, `default_instances`); imports it."""
        return import_module(self.launcher.rpartition(".")[0])

    def launcher_class(self):
        """The launcher class (`kvlab.kernels.gqa.Gqa`, ...); imports its module (torch)."""
        return getattr(self.module, self.launcher.rpartition(".")[2])

    def check_shape(self, block_size: int, num_qo_heads: int, num_kv_heads: int) -> None:
        """ValueError unless the family takes blocks of `block_size` tokens and
        num_qo_heads / num_kv_heads query heads a KV head (num_qo_heads a multiple of
        num_kv_heads, checked by the caller)."""
        if block_size not in self.block_sizes:
            raise ValueError(f"block_size={block_size}: kernel={self.name!r} supports "
                             f"{self.block_sizes}")
        group = num_qo_heads // num_kv_heads
        if self.max_group is not None and group > self.max_group:
            raise ValueError(f"num_qo_heads / num_kv_heads = {group}: kernel={self.name!r} "
                             f"supports groups 1 to {self.max_group}")


KERNEL_FAMILIES = {
    family.name: family
    for family in (
        # vLLM's PagedAttention v1/v2 (kernels/paged_decode_vllm.cu)
        KernelFamily(name="vllm_v1", source="paged_decode_vllm.cu",
                     launcher="kvlab.kernels.vllm_v1.VllmV1", layout="vllm",
                     block_sizes=(8, 16, 32), max_group=None, head_dims=HEAD_DIMS,
                     cache_dtypes=("float16", "bfloat16")),
        # group-aware split-KV (kernels/paged_decode_gqa.cu); a group is the n-width of one mma
        KernelFamily(name="gqa", source="paged_decode_gqa.cu",
                     launcher="kvlab.kernels.gqa.Gqa", layout="hnd",
                     block_sizes=(8, 16, 32, 64, 128, 256), max_group=8, head_dims=HEAD_DIMS,
                     cache_dtypes=("float16", "bfloat16", "fp8")),
    )
}
FAMILIES = tuple(KERNEL_FAMILIES)  # their names
AUTO_FAMILY = "gqa"  # the family kernel="auto" runs where it picks the cache's layout
KERNELS = ("auto", *FAMILIES)
# every block size some family takes
BLOCK_SIZES = tuple(sorted({size for f in KERNEL_FAMILIES.values() for size in f.block_sizes}))


def kernel_layout(kernel: str) -> str:
    """The cache layout `kernel` (one of KERNELS) reads; "auto": AUTO_FAMILY's. ValueError for
    another name."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel={kernel!r}: must be one of {KERNELS}")
    return KERNEL_FAMILIES[AUTO_FAMILY if kernel == "auto" else kernel].layout


def family_for_layout(layout: str) -> str:
    """The family that reads `layout` (what kernel="auto" runs on a cache of that layout)."""
    for family in KERNEL_FAMILIES.values():
        if family.layout == layout:
            return family.name
    raise ValueError(f"layout={layout!r}: no kernel family reads it (families read "
                     f"{tuple(f.layout for f in KERNEL_FAMILIES.values())})")

