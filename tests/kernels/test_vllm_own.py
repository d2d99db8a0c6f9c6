"""vLLM's own kernels from a cubin (kvlab.kernels.vllm_own, `bench attention --vllm-cubin`).

CPU: the symbols, what a benchmark records about the cubin, the options --vllm-cubin refuses, and
vllm_cubin.sh's refusal of a tree without the kernels. GPU: vLLM's kernels against the reference
and in the benchmark's loop; they need a cubin built by benchmarks/vllm_cubin.sh, named by
KVLAB_VLLM_CUBIN (skipped without one: kvlab ships none of vLLM's code).
"""

import json
import math
import os
import subprocess
from pathlib import Path

import pytest
import torch

from kvlab.bench.cli import main
from kvlab.kernels import vllm_own

ROOT = Path(__file__).resolve().parents[2]
CUBIN = os.environ.get("KVLAB_VLLM_CUBIN")
needs_cubin = pytest.mark.skipif(CUBIN is None, reason="KVLAB_VLLM_CUBIN names no cubin "
                                 "(build one with benchmarks/vllm_cubin.sh)")


def test_symbols_are_those_nvcc_gives_vllms_templates():
    # read from the cubin nvcc 13 built from vLLM 0.9.2's source (cuobjdump -symbols)
    assert vllm_own.mangled_names(128, 16) == (
        "_ZN4vllm25paged_attention_v1_kernelIttLi128ELi16ELi128ELNS_18Fp8KVCacheDataTypeE0ELb0"
        "EEEvPT_PKS2_PKT0_S8_ifPKiSA_iPKfiiiSC_SC_iiiii",
        "_ZN4vllm25paged_attention_v2_kernelIttLi128ELi16ELi128ELNS_18Fp8KVCacheDataTypeE0ELb0"
        "ELi512EEEvPfS2_PT_PKS3_PKT0_S9_ifPKiSB_iPKfiiiSD_SD_iiiii",
        "_ZN4vllm32paged_attention_v2_reduce_kernelItLi128ELi128ELi512EEEvPT_PKfS4_PKS1_PKii")
    v1, v2, _ = vllm_own.mangled_names(128, 32)
    assert "Li128ELi32ELi128E" in v1 and "Li128ELi32ELi128E" in v2


def test_a_cubin_is_recorded_by_name_hash_and_build(tmp_path):
    cubin = tmp_path / "vllm.cubin"
    cubin.write_bytes(b"\x7fELF not really")
    info = vllm_own.describe(cubin)
    assert info == {"file": "vllm.cubin", "sha256": info["sha256"]} and len(info["sha256"]) == 64
    (tmp_path / "vllm.cubin.json").write_text(json.dumps({"vllm": "0.9.2"}))
    assert vllm_own.describe(cubin)["build"] == {"vllm": "0.9.2"}
    (tmp_path / "vllm.cubin.json").write_text("{vllm")
    with pytest.raises(ValueError, match="vllm.cubin.json'.*not JSON"):
        vllm_own.describe(cubin)
    with pytest.raises(ValueError, match="no such file"):
        vllm_own.describe(tmp_path / "missing.cubin")


@pytest.mark.parametrize(("options", "message"), [
    (["--kernels", "gqa"], "--vllm-cubin times vLLM's kernels on vllm_v1's cache: --kernels gqa "
                           "leaves vllm_v1 out"),
    (["--dtype", "bfloat16"], "--vllm-cubin with --dtype bfloat16: vllm_cubin.sh builds vLLM's "
                              "fp16 kernels only"),
    (["--block-sizes", "16", "64"], "--vllm-cubin with --block-sizes 64: vLLM's kernels are "
                                    "built for 8, 16, 32"),
    (["--models", "tiny-llama"], "--vllm-cubin with --models tiny-llama (head_dim 64)"),
    ([], "no such file"),
])
def test_vllm_cubin_refuses_what_vllms_kernels_cannot_run(tmp_path, capsys, options, message):
    cubin = tmp_path / "vllm.cubin"
    if options:  # the options are refused even though the file is there
        cubin.write_bytes(b"\x7fELF not really")
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "attention", "--vllm-cubin", str(cubin), *options])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_vllm_cubin_sh_wants_a_tree_with_the_kernels(tmp_path):
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "vllm_cubin.sh"), str(tmp_path),
                           str(tmp_path / "out.cubin")], capture_output=True, text=True)
    assert done.returncode == 2
    assert "no csrc/attention/attention_kernels.cuh" in done.stderr
    assert not (tmp_path / "out.cubin").exists()


@pytest.mark.gpu
@needs_cubin
@pytest.mark.parametrize(("lens", "heads", "variant"), [
    ([1, 17, 97, 3000, 3, 600], (8, 2), "v2"),  # one partition would not cover 3000 tokens
    ([1 + (37 * i) % 256 for i in range(40)], (8, 2), "v1"),  # one partition covers them
    ([9000, 20], (28, 4), "v2"),  # beyond v1's 8k
])
def test_vllms_kernels_match_the_reference(lens, heads, variant):
    from kvlab.cache import PagedKVCache
    from kvlab.kernels.decode import DecodePlan
    from kvlab.reference import decode_attention as reference

    num_qo_heads, num_kv_heads = heads
    torch.manual_seed(0)
    cache = PagedKVCache(sum(-(-n // 16) for n in lens) + 3, 16, num_kv_heads, 128,
                         dtype=torch.float16, device="cuda", layout="vllm", seed=0)
    cache.k_cache.fill_(math.nan)  # slots no sequence wrote must never reach the output
    cache.v_cache.fill_(math.nan)
    seq_ids = [cache.add_sequence(*(torch.randn(n, num_kv_heads, 128, device="cuda").half()
                                    for _ in "kv")) for n in lens]
    q = torch.randn(len(lens), num_qo_heads, 128, device="cuda").half()
    plan = DecodePlan(cache, seq_ids, num_qo_heads, "vllm_v1")
    own = vllm_own.VllmOwn(CUBIN, cache, num_qo_heads, lens)
    assert own.variant == variant
    out = torch.full_like(q, math.nan)
    own(out, q, cache.k_cache, cache.v_cache, plan.block_tables, plan.seq_lens)
    ref = reference(q, cache, seq_ids)
    err = ((out.float() - ref).flatten(1).norm(dim=1) / ref.flatten(1).norm(dim=1)).max()
    assert err.item() < 2e-3


@pytest.mark.gpu
@needs_cubin
def test_the_benchmark_times_vllms_kernels_in_vllm_v1s_loop(tmp_path):
    out = tmp_path / "attention.json"
    main(["bench", "attention", "--json", str(out), "--models", "llama3-8b", "--points",
          "4x1024", "64x1024", "--prefetch", "none", "--runs", "3", "--kernels", "vllm_v1",
          "--vllm-cubin", CUBIN])
    result = json.loads(out.read_text())
    assert result["vllm_cubin"]["file"] == Path(CUBIN).name
    own = {r["batch"]: r for r in result["rows"] if r["kernel"] == "vllm_own"}
    assert {b: r["vllm_variant"] for b, r in own.items()} == {4: "v2", 64: "v1"}
    ours = {r["batch"]: r for r in result["rows"] if r["kernel"] == "vllm_v1"}
    assert all(own[b]["loop"] == ours[b]["loop"] and own[b]["gbps"] > 0 for b in own)
