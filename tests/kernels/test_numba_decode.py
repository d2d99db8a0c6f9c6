"""The Numba paged decode kernel against a dense numpy reference.

CPU: the kernel runs in Numba's CUDA simulator, in ONE subprocess started with
NUMBA_ENABLE_CUDASIM=1 (the simulator must be chosen before numba.cuda is imported, and this
process keeps the real target). The subprocess is this file run as a script; it writes every
case's output to a folder and the tests compare them here. GPU: the same comparison on the device.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SIM_HEAD_DIM = 64
SIM_SEQ_LENS = (1, 5, 17)
# (name, block_size, group, num_kv_heads, prefetch_distance, dtype, inputs on "host" or "device")
SIM_CASES = [
    ("bs4-g1-pf0", 4, 1, 2, 0, "float32", "host"),
    ("bs4-g2-pf1", 4, 2, 1, 1, "float32", "host"),
    ("bs4-g3-pf0", 4, 3, 1, 0, "float32", "host"),
    ("bs16-g1-pf1", 16, 1, 1, 1, "float32", "host"),
    ("bs16-g3-pf1", 16, 3, 1, 1, "float32", "host"),
    ("bs16-g2-fp16", 16, 2, 1, 0, "float16", "host"),
    ("bs4-g1-device", 4, 1, 1, 1, "float32", "device"),
]


def make_inputs(seq_lens, block_size, group, num_kv_heads, head_dim, dtype, seed=0):
    """Random q and "hnd" KV cache; each sequence's blocks are scattered over a shuffled pool
    with spare blocks, and its block_tables row is padded with 0 past its last block."""
    rng = np.random.default_rng(seed)
    num_qo_heads = num_kv_heads * group
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 3
    ids = rng.permutation(num_blocks).astype(np.int32)
    block_tables = np.zeros((len(seq_lens), max(blocks_per_seq)), np.int32)
    start = 0
    for i, n in enumerate(blocks_per_seq):
        block_tables[i, :n] = ids[start : start + n]
        start += n
    cache_shape = (num_blocks, num_kv_heads, block_size, head_dim)
    return {
        "q": rng.standard_normal((len(seq_lens), num_qo_heads, head_dim)).astype(dtype),
        "k_cache": rng.standard_normal(cache_shape).astype(dtype),
        "v_cache": rng.standard_normal(cache_shape).astype(dtype),
        "block_tables": block_tables,
        "seq_lens": np.array(seq_lens, np.int32),
    }


def reference_decode(q, k_cache, v_cache, block_tables, seq_lens, scale=None):
    """softmax(q . k * scale) @ v per (sequence, query head), from a dense copy, in float64."""
    num_seqs, num_qo_heads, head_dim = q.shape
    _, num_kv_heads, block_size, _ = k_cache.shape
    group = num_qo_heads // num_kv_heads
    scale = 1.0 / np.sqrt(head_dim) if scale is None else scale
    out = np.zeros(q.shape, np.float64)
    for s in range(num_seqs):
        n = int(seq_lens[s])
        blocks = block_tables[s, : -(-n // block_size)]
        # [num_blocks_s, num_kv_heads, block_size, D] -> [num_kv_heads, n, D]
        k = (
            k_cache[blocks]
            .astype(np.float64)
            .transpose(1, 0, 2, 3)
            .reshape(num_kv_heads, -1, head_dim)[:, :n]
        )
        v = (
            v_cache[blocks]
            .astype(np.float64)
            .transpose(1, 0, 2, 3)
            .reshape(num_kv_heads, -1, head_dim)[:, :n]
        )
        for h in range(num_qo_heads):
            logits = k[h // group] @ q[s, h].astype(np.float64) * scale
            p = np.exp(logits - logits.max())
            out[s, h] = (p / p.sum()) @ v[h // group]
    return out


def _sim_inputs(case):
    _, block_size, group, num_kv_heads, _, dtype, _ = case
    return make_inputs(SIM_SEQ_LENS, block_size, group, num_kv_heads, SIM_HEAD_DIM, dtype)


def _run_sim_cases(out_dir: Path) -> None:
    """In the simulator subprocess: run every case, save outputs (or the error) to out_dir."""
    from numba import cuda

    from kvlab.kernels import numba_decode

    assert numba_decode.SIMULATED
    results = {}
    for case in SIM_CASES:
        name, _, _, _, prefetch_distance, dtype, where = case
        inputs = _sim_inputs(case)
        out = np.zeros(inputs["q"].shape, dtype) if dtype == "float16" else None
        if where == "device":
            inputs = {key: cuda.to_device(value) for key, value in inputs.items()}
        try:
            result = numba_decode.decode_attention_numba(
                **inputs, prefetch_distance=prefetch_distance, out=out
            )
        except Exception as err:  # reported to the parent test, not raised here
            results[name] = f"{type(err).__name__}: {err}"
            continue
        if where == "device":
            result = result.copy_to_host()
        assert out is None or result is out
        np.save(out_dir / f"{name}.npy", result)
        results[name] = "ok"
    # Mixing numpy and device arrays is refused.
    inputs = _sim_inputs(SIM_CASES[0])
    inputs["q"] = cuda.to_device(inputs["q"])
    try:
        numba_decode.decode_attention_numba(**inputs)
        results["mixed"] = "no error"
    except ValueError as err:
        results["mixed"] = str(err)
    (out_dir / "results.json").write_text(json.dumps(results))


@pytest.fixture(scope="module")
def sim_results(tmp_path_factory):
    import kvlab

    out_dir = tmp_path_factory.mktemp("numba_sim")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    checkout = str(Path(kvlab.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [checkout, env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, __file__, str(out_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out_dir, json.loads((out_dir / "results.json").read_text())


@pytest.mark.parametrize("case", SIM_CASES, ids=[c[0] for c in SIM_CASES])
def test_simulator_matches_reference(sim_results, case):
    out_dir, results = sim_results
    name, dtype = case[0], case[5]
    assert results[name] == "ok", results[name]
    got = np.load(out_dir / f"{name}.npy")
    inputs = _sim_inputs(case)
    want = reference_decode(**inputs)
    assert got.dtype == (np.float16 if dtype == "float16" else np.float32)
    assert got.shape == want.shape
    tol = 2e-3 if dtype == "float16" else 1e-5
    np.testing.assert_allclose(got.astype(np.float64), want, atol=tol, rtol=tol)


def test_simulator_refuses_mixed_host_and_device(sim_results):
    _, results = sim_results
    assert "must be all numpy arrays or all CUDA arrays" in results["mixed"]


def _valid_inputs():
    return make_inputs((3, 9), 4, 2, 1, 32, "float32")


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: a.update(q=a["q"][:, :, :16].copy()), "q.shape[2]=16"),
        (lambda a: a.update(q=a["q"][0]), "q.shape=(2, 32)"),
        (lambda a: a.update(q=a["q"].astype(np.float64)), "q.dtype=float64"),
        (lambda a: a.update(q=np.asfortranarray(a["q"])), "q: must be C-contiguous"),
        (lambda a: a.update(q=a["q"].tolist()), "q: must be a numpy.ndarray"),
        (lambda a: a.update(k_cache=a["k_cache"][:, :, :, :, None]), "k_cache.shape="),
        (lambda a: a.update(v_cache=a["v_cache"].astype(np.float16)), "v_cache: shape"),
        (
            lambda a: a.update(block_tables=a["block_tables"].astype(np.int64)),
            "block_tables.dtype=int64",
        ),
        (lambda a: a.update(block_tables=a["block_tables"][:1]), "block_tables.shape=(1, 3)"),
        (lambda a: a.update(seq_lens=a["seq_lens"][:1]), "seq_lens.shape=(1,)"),
        (lambda a: a["seq_lens"].__setitem__(1, 13), "seq_lens[1]=13"),
        (lambda a: a["seq_lens"].__setitem__(0, 0), "seq_lens[0]=0"),
        (lambda a: a["block_tables"].__setitem__((1, 2), 99), "block_tables[1, 2]=99"),
        (lambda a: a.update(scale=float("nan")), "scale=nan"),
        (lambda a: a.update(prefetch_distance=-1), "prefetch_distance=-1"),
        (lambda a: a.update(out=np.zeros((2, 2, 32), np.float16)), "out: shape"),
    ],
)
def test_validation_errors(change, message):
    from kvlab.kernels.numba_decode import decode_attention_numba

    inputs = _valid_inputs()
    change(inputs)
    with pytest.raises(ValueError, match=re.escape(message)):
        decode_attention_numba(**inputs)


def test_validation_gqa_and_head_dim():
    from kvlab.kernels.numba_decode import decode_attention_numba

    inputs = make_inputs((3,), 4, 1, 2, 32, "float32")
    inputs["q"] = inputs["q"][:, :1].copy()
    with pytest.raises(ValueError, match="num_qo_heads=1: must be a multiple of num_kv_heads=2"):
        decode_attention_numba(**inputs)
    inputs = make_inputs((3,), 4, 1, 1, 264, "float32")
    with pytest.raises(ValueError, match="head_dim=264"):
        decode_attention_numba(**inputs)


GPU_SEQ_LENS = (1, 16, 97, 513)


def _rel_l2(got, want):
    return np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want)


@pytest.mark.gpu
@pytest.mark.parametrize("prefetch_distance", [0, 2])
@pytest.mark.parametrize("group", [1, 4, 7])
def test_gpu_torch_fp16_matches_reference(group, prefetch_distance):
    import torch

    from kvlab.kernels.numba_decode import decode_attention_numba

    inputs = make_inputs(GPU_SEQ_LENS, 16, group, 2, 128, "float16", seed=group)
    tensors = {key: torch.from_numpy(value).cuda() for key, value in inputs.items()}
    out = decode_attention_numba(**tensors, prefetch_distance=prefetch_distance)
    got = out.copy_to_host()
    assert got.dtype == np.float32
    assert _rel_l2(got, reference_decode(**inputs)) < 2e-3


@pytest.mark.gpu
def test_gpu_out_in_q_dtype_and_numpy_inputs():
    import torch

    from kvlab.kernels.numba_decode import decode_attention_numba

    inputs = make_inputs(GPU_SEQ_LENS, 16, 4, 2, 128, "float16", seed=3)
    want = reference_decode(**inputs)
    tensors = {key: torch.from_numpy(value).cuda() for key, value in inputs.items()}
    out = torch.empty(tensors["q"].shape, dtype=torch.float16, device="cuda")
    assert decode_attention_numba(**tensors, prefetch_distance=1, out=out) is out
    torch.cuda.synchronize()
    assert _rel_l2(out.cpu().numpy(), want) < 2e-3
    got = decode_attention_numba(**inputs)  # numpy in, numpy out
    assert isinstance(got, np.ndarray) and got.dtype == np.float32
    assert _rel_l2(got, want) < 2e-3


if __name__ == "__main__":
    _run_sim_cases(Path(sys.argv[1]))
