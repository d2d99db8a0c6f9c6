"""FlashInfer as a peer: kvlab's block tables as FlashInfer's CSR, the adapter checked against a
fake flashinfer module on the CPU, and FlashInfer's own output against the reference (GPU)."""

import importlib.util
import sys

import pytest
import torch
from factories import FakeWrapper, install_fake_flashinfer, make_cache, make_seq

from kvlab.cache import filled_cache
from kvlab.kernels import flashinfer_peer
from kvlab.kernels.flashinfer_peer import FlashInferDecode, kv_csr
from kvlab.reference import decode_attention


def test_csr_of_a_hand_built_batch():
    tables = torch.tensor([[7, 3, 0], [5, 0, 0], [1, 2, 4]], dtype=torch.int32)
    indptr, indices, last = kv_csr(tables, torch.tensor([17, 8, 24]), block_size=8)
    assert indptr.tolist() == [0, 3, 4, 7]
    assert indices.tolist() == [7, 3, 0, 5, 1, 2, 4]
    assert last.tolist() == [1, 8, 8]
    assert {t.dtype for t in (indptr, indices, last)} == {torch.int32}


@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_csr_of_random_tables_reads_back_every_token(block_size):
    gen = torch.Generator().manual_seed(block_size)
    lens = torch.tensor([1, 17, 97, block_size])
    width = 97 // block_size + 2
    tables = torch.randint(0, 1000, (len(lens), width), generator=gen, dtype=torch.int32)
    indptr, indices, last = kv_csr(tables, lens, block_size)
    for b, n in enumerate(lens.tolist()):
        blocks = indices[indptr[b]:indptr[b + 1]]
        assert blocks.tolist() == tables[b, :len(blocks)].tolist()
        assert (len(blocks) - 1) * block_size + last[b] == n
        assert 1 <= last[b] <= block_size


@pytest.mark.parametrize("tables, lens, match", [
    (torch.zeros(3, dtype=torch.int32), torch.tensor([1]), "block_tables.shape"),
    (torch.zeros(2, 1, dtype=torch.int32), torch.tensor([1]), "seq_lens.shape"),
    (torch.zeros(1, 1, dtype=torch.int32), torch.tensor([0]), "seq_lens"),
    (torch.zeros(1, 1, dtype=torch.int32), torch.tensor([9]), "need 2"),
])
def test_csr_errors_name_the_parameter(tables, lens, match):
    with pytest.raises(ValueError, match=match):
        kv_csr(tables, lens, 8)


@pytest.fixture
def fake_flashinfer(monkeypatch):
    return install_fake_flashinfer(monkeypatch, ("cuda", "cpu"))


def make_batch(lens, block_size, num_kv_heads, dtype=torch.float16, head_dim=64):
    cache = make_cache(num_blocks=64, block_size=block_size, num_kv_heads=num_kv_heads,
                       head_dim=head_dim, dtype=dtype)
    return cache, [make_seq(cache, n, seed=i)[0] for i, n in enumerate(lens)]


@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("tensor_cores", [False, True])
def test_adapter_hands_flashinfer_the_cache_itself(fake_flashinfer, block_size, group,
                                                   tensor_cores):
    cache, seq_ids = make_batch([1, 17, 97], block_size, num_kv_heads=2)
    q = torch.randn(3, 2 * group, 64).half()
    decode = FlashInferDecode(cache, seq_ids, 2 * group, use_tensor_cores=tensor_cores)
    out = decode.run(q)
    (wrapper,) = FakeWrapper.made
    assert (wrapper.kv_layout, wrapper.use_tensor_cores) == ("HND", tensor_cores)
    assert wrapper.backend == "fa2"  # never "auto", which may hand the plan to cuDNN
    p = wrapper.planned
    assert (p["num_qo_heads"], p["num_kv_heads"], p["head_dim"], p["page_size"]) == (
        2 * group, 2, 64, block_size)
    assert (p["q_data_type"], p["kv_data_type"], p["pos_encoding_mode"]) == (
        torch.float16, torch.float16, "NONE")
    expected = kv_csr(cache.block_tables(seq_ids), cache.seq_lens(seq_ids), block_size)
    for got, want in zip((p["indptr"], p["indices"], p["last_page_len"]), expected, strict=True):
        assert torch.equal(got, want)
    assert wrapper.ran["k_cache"] is cache.k_cache and wrapper.ran["v_cache"] is cache.v_cache
    ref = decode_attention(q, cache, seq_ids)
    torch.testing.assert_close(out.float(), ref, atol=2e-3, rtol=2e-3)


def fp8_batch(amax_per_head):
    """An fp8 cache of one 33-token sequence whose heads' K and V peak at `amax_per_head`, so
    their scales are amax / 448."""
    cache = make_cache(num_blocks=32, block_size=16, num_kv_heads=len(amax_per_head),
                       head_dim=64, dtype=torch.float8_e4m3fn)
    gen = torch.Generator().manual_seed(0)
    k, v = (torch.rand(33, len(amax_per_head), 64, generator=gen) * 2 - 1 for _ in "kv")
    for t in (k, v):
        t[0, :, 0] = 1.0
        t *= torch.tensor(amax_per_head)[None, :, None]
    return cache, [cache.add_sequence(k, v)]


def test_adapter_passes_an_fp8_cache_and_its_scales(fake_flashinfer):
    cache, seq_ids = fp8_batch([2.0, 2.0])
    decode = FlashInferDecode(cache, seq_ids, 4)
    (wrapper,) = FakeWrapper.made
    assert wrapper.planned["kv_data_type"] == torch.float8_e4m3fn
    assert wrapper.planned["q_data_type"] == torch.float16
    q = torch.randn(1, 4, 64).half()
    out = torch.empty_like(q)
    assert decode.run(q, out=out) is out
    assert wrapper.ran["k_scale"] == wrapper.ran["v_scale"] == pytest.approx(2.0 / 448)
    torch.testing.assert_close(out.float(), decode_attention(q, cache, seq_ids),
                               atol=1e-2, rtol=1e-2)


def test_an_fp8_cache_with_a_scale_per_head_is_refused(fake_flashinfer):
    cache, seq_ids = fp8_batch([1.0, 2.0])
    with pytest.raises(ValueError, match="cache.k_scale=.*one scale for every KV head"):
        FlashInferDecode(cache, seq_ids, 4)
    assert FakeWrapper.made == []


def test_bad_arguments_are_refused_before_planning(fake_flashinfer):
    cache, seq_ids = make_batch([5], 16, num_kv_heads=2)
    with pytest.raises(ValueError, match="num_qo_heads=3"):
        FlashInferDecode(cache, seq_ids, 3)
    with pytest.raises(ValueError, match="q_dtype"):
        FlashInferDecode(cache, seq_ids, 2, q_dtype=torch.float32)
    with pytest.raises(ValueError, match=r"seq_ids=\[\]"):
        FlashInferDecode(cache, [], 2)
    vllm = make_cache(num_blocks=8, block_size=16, num_kv_heads=2, head_dim=64,
                      dtype=torch.float16, layout="vllm")
    with pytest.raises(ValueError, match="cache.layout='vllm'"):
        FlashInferDecode(vllm, [], 2)
    fp32, fp32_ids = make_batch([5], 16, num_kv_heads=2, dtype=torch.float32)
    with pytest.raises(ValueError, match="cache.dtype=torch.float32"):
        FlashInferDecode(fp32, fp32_ids, 2)
    assert FakeWrapper.made == []
    decode = FlashInferDecode(cache, seq_ids, 2)
    with pytest.raises(ValueError, match=r"q: shape \(1, 4, 64\)"):
        decode.run(torch.zeros(1, 4, 64, dtype=torch.float16))
    with pytest.raises(ValueError, match="out: shape"):
        decode.run(torch.zeros(1, 2, 64, dtype=torch.float16),
                   out=torch.zeros(1, 2, 64, dtype=torch.bfloat16))


def test_a_cpu_cache_is_refused_without_the_fake(monkeypatch):
    cache, seq_ids = make_batch([5], 16, num_kv_heads=2)
    with pytest.raises(ValueError, match="cache.device=cpu"):
        FlashInferDecode(cache, seq_ids, 2)


def test_missing_flashinfer_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # import raises ImportError
    monkeypatch.setattr(flashinfer_peer, "DEVICE_TYPES", ("cuda", "cpu"))
    cache, seq_ids = make_batch([5], 16, num_kv_heads=2)
    with pytest.raises(RuntimeError, match=r"pip install flashinfer-python==\S+"):
        FlashInferDecode(cache, seq_ids, 2)
    reason = flashinfer_peer.unavailable_reason()
    assert reason == "no CUDA GPU" or "pip install flashinfer-python" in reason
    assert not flashinfer_peer.available()


@pytest.mark.gpu
@pytest.mark.skipif(flashinfer_peer.unavailable_reason() is not None,
                    reason=str(flashinfer_peer.unavailable_reason()))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("tensor_cores", [False, True])
@pytest.mark.parametrize("block_size, lens", [(16, [1, 17, 97]), (32, [97, 1, 1000, 17])])
def test_flashinfer_matches_the_reference(dtype, group, tensor_cores, block_size, lens):
    num_kv_heads = 2
    cache, seq_ids, _ = filled_cache(len(lens), lens, block_size, num_kv_heads, 128,
                                     layout="hnd", dtype=dtype)
    q = torch.randn(len(lens), num_kv_heads * group, 128, device="cuda", dtype=dtype)
    out = FlashInferDecode(cache, seq_ids, num_kv_heads * group,
                           use_tensor_cores=tensor_cores).run(q)
    tol = {torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(out.float(), decode_attention(q, cache, seq_ids),
                               atol=tol, rtol=tol)


@pytest.mark.gpu
@pytest.mark.skipif(flashinfer_peer.unavailable_reason() is not None,
                    reason=str(flashinfer_peer.unavailable_reason()))
@pytest.mark.parametrize("tensor_cores", [False, True])
def test_flashinfer_reads_an_fp8_cache_with_fp16_queries(tensor_cores):
    lens, num_kv_heads, group = [1, 17, 97, 1000], 2, 4
    cache, seq_ids, _ = filled_cache(len(lens), lens, 16, num_kv_heads, 128, layout="hnd",
                                     dtype=torch.float8_e4m3fn)
    q = torch.randn(len(lens), num_kv_heads * group, 128, device="cuda", dtype=torch.float16)
    decode = FlashInferDecode(cache, seq_ids, num_kv_heads * group, use_tensor_cores=tensor_cores)
    assert decode.q_dtype == torch.float16 and decode.k_scale == 1.0
    torch.testing.assert_close(decode.run(q).float(), decode_attention(q, cache, seq_ids),
                               atol=1e-2, rtol=1e-2)


def test_the_cuda_core_path_refuses_groups_it_is_not_built_for(fake_flashinfer):
    cache, seq_ids = make_batch([5, 9], 16, 4)
    with pytest.raises(ValueError, match=r"28 / 4 = 7: FlashInfer's CUDA-core decode takes "
                                         r"groups of \(1, 2, 3, 4, 6, 8, 16\)"):
        FlashInferDecode(cache, seq_ids, 28)
    assert not FakeWrapper.made  # refused before anything was planned
    FlashInferDecode(cache, seq_ids, 28, use_tensor_cores=True)  # the tensor-core path takes it
    assert flashinfer_peer.unsupported(32, 8, use_tensor_cores=False) is None


@pytest.mark.parametrize("heads, match", [((32, 0), "num_kv_heads=0: must be an int >= 1"),
                                          ((30, 8), "num_qo_heads=30: must be a multiple of"),
                                          ((True, 1), "num_qo_heads=True")])
def test_the_group_check_refuses_bad_head_counts(heads, match):
    with pytest.raises(ValueError, match=match):
        flashinfer_peer.unsupported(*heads, use_tensor_cores=False)


@pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None,
                    reason="flashinfer is not installed")
def test_the_cuda_core_groups_are_those_of_the_installed_header():
    import pathlib
    import re

    import flashinfer

    header = (pathlib.Path(flashinfer.__file__).parent / "data" / "include" / "flashinfer"
              / "utils.cuh").read_text()
    dispatch = header[header.index("#define DISPATCH_GQA_GROUP_SIZE"):]
    dispatch = dispatch[:dispatch.index("Unsupported group_size")]
    groups = tuple(int(g) for g in re.findall(r"group_size == (\d+)", dispatch))
    assert groups == flashinfer_peer.CUDA_CORE_GROUPS
