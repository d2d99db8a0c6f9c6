"""Small factories for tests: explicit data, no hidden fixtures."""

import contextlib
import signal
import subprocess
import sys

import numpy as np
import torch

from kvlab.cache import PagedKVCache
from kvlab.offload.host import HostStore, fill
from kvlab.offload.weights import HostLayers
from kvlab.workload import Workload


def make_cache(num_blocks=64, block_size=16, num_kv_heads=2, head_dim=64, dtype=torch.float32,
               layout="hnd", device="cpu") -> PagedKVCache:
    return PagedKVCache(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype,
                        device=device, layout=layout)


def make_kv(cache: PagedKVCache, seq_len: int, seed: int = 0):
    """Random (k, v), each [seq_len, num_kv_heads, head_dim], in the cache's dtype and device."""
    gen = torch.Generator().manual_seed(seed)
    shape = (seq_len, cache.num_kv_heads, cache.head_dim)
    k = torch.randn(shape, generator=gen).to(cache.dtype).to(cache.device)
    v = torch.randn(shape, generator=gen).to(cache.dtype).to(cache.device)
    return k, v


def make_seq(cache: PagedKVCache, seq_len: int, seed: int = 0, token_ids=None):
    """Add a random sequence; returns (seq_id, k, v)."""
    k, v = make_kv(cache, seq_len, seed)
    return cache.add_sequence(k, v, token_ids=token_ids), k, v


def make_workload_of(prompt_lens, output_lens, max_seq_len, prefix_group=None, prefix_lens=None):
    """A Workload from plain lists."""
    return Workload(
        np.array(prompt_lens),
        np.array(output_lens),
        max_seq_len,
        None if prefix_group is None else np.array(prefix_group),
        None if prefix_lens is None else np.array(prefix_lens),
    )


def check_imports_leave_out(statements: str, modules: tuple[str, ...]) -> None:
    """Run `statements` in a fresh interpreter on the "sim" backend; fail if any of `modules` was
    imported by them."""
    code = (f"import os, sys; os.environ['KVLAB_BACKEND'] = 'sim'\n{statements}\n"
            f"loaded = [m for m in {modules!r} if m in sys.modules]\n"
            f"assert not loaded, f'imported {{loaded}}'")
    subprocess.run([sys.executable, "-c", code], check=True)


def make_cpu_stores(model, layers, count, batch, max_context, context, seed=0):
    """`count` pageable float32 HostStores (GPU batches) of `model`, each filled with `context`
    tokens by `layers` (store g from seed + 100 g)."""
    stores = [HostStore(model, batch, max_context, dtype=torch.float32, pinned=False)
              for _ in range(count)]
    for g, store in enumerate(stores):
        fill(store, layers, context, seed=seed + 100 * g)
    return stores


def placed(layers, weights):
    """`layers` as KVPRDecoder takes them: resident as they are, or offloaded (pageable)."""
    return HostLayers(layers, pinned=False) if weights == "offloaded" else layers


def non_finite_paths(value, path="") -> list[str]:
    """Where a figure's JSON (`fig.to_plotly_json()`, numpy arrays included) holds NaN or inf:
    a FigureWidget cannot send those to the browser (they are not JSON)."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in non_finite_paths(v, f"{path}.{k}")]
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [p for i, v in enumerate(value) for p in non_finite_paths(v, f"{path}[{i}]")]
    if isinstance(value, float) and not np.isfinite(value):
        return [path]
    return []


def force_gqa_warps(monkeypatch, warps: int) -> None:
    """gqa's plans take `warps` warps a CTA, at the partition size the split model picks."""
    from kvlab.kernels import gqa

    plan = gqa.split_plan
    monkeypatch.setattr(gqa, "split_plan", lambda *a, **k: plan(*a, **k)._replace(warps=warps))


@contextlib.contextmanager
def no_hang(seconds: int = 20):
    """Fail (TimeoutError) instead of waiting forever: a hang of the code under test (or a list
    of a trillion entries it builds) must not hang the suite."""
    def expire(*_):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


class FakeWrapper:
    """flashinfer.BatchDecodeWithPagedKVCacheWrapper on the CPU: records its arguments and
    computes attention from the CSR and K/V tuple it was handed, as FlashInfer reads them."""

    made: list = []

    def __init__(self, workspace, kv_layout="NHD", use_tensor_cores=False, backend="auto"):
        self.kv_layout, self.use_tensor_cores, self.backend = kv_layout, use_tensor_cores, backend
        self.workspace = workspace
        FakeWrapper.made.append(self)

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
             page_size, **kwargs):
        self.planned = dict(indptr=indptr, indices=indices, last_page_len=last_page_len,
                            num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
                            head_dim=head_dim, page_size=page_size, **kwargs)

    def run(self, q, paged_kv_cache, k_scale=None, v_scale=None, out=None):
        assert self.kv_layout == "HND"
        p = self.planned
        k_cache, v_cache = paged_kv_cache  # each [pages, num_kv_heads, page_size, head_dim]
        self.ran = dict(q=q, k_cache=k_cache, v_cache=v_cache, k_scale=k_scale, v_scale=v_scale)
        group = p["num_qo_heads"] // p["num_kv_heads"]
        result = torch.empty(q.shape, dtype=torch.float32)
        for b in range(q.shape[0]):
            pages = p["indices"][p["indptr"][b]:p["indptr"][b + 1]].long()
            n = (len(pages) - 1) * p["page_size"] + int(p["last_page_len"][b])
            k, v = (c[pages].float().permute(1, 0, 2, 3).reshape(p["num_kv_heads"], -1,
                                                                  p["head_dim"])[:, :n]
                    for c in (k_cache, v_cache))  # [num_kv_heads, n, head_dim]
            k, v = (t.repeat_interleave(group, 0) for t in (k, v))
            logits = torch.einsum("hd,hnd->hn", q[b].float(), k)
            logits *= p["sm_scale"] * (k_scale or 1.0)
            result[b] = torch.einsum("hn,hnd->hd", logits.softmax(-1), v) * (v_scale or 1.0)
        result = result.to(q.dtype)
        if out is not None:
            out.copy_(result)
            return out
        return result


def install_fake_flashinfer(monkeypatch, device_types=("cpu",)):
    """Put a fake `flashinfer` (FakeWrapper as its decode wrapper) in sys.modules and let
    kvlab.kernels.flashinfer_peer take caches on `device_types`; returns the fake module."""
    import types

    from kvlab.kernels import flashinfer_peer

    fake = types.ModuleType("flashinfer")
    fake.BatchDecodeWithPagedKVCacheWrapper = FakeWrapper
    FakeWrapper.made = []
    monkeypatch.setitem(sys.modules, "flashinfer", fake)
    monkeypatch.setattr(flashinfer_peer, "DEVICE_TYPES", tuple(device_types))
    return fake
