"""Per-CTA timelines (kvlab.kernels.timeline): records read back and summed up (CPU); on the GPU,
every CTA of a traced step stamped in the order of its work, the merge released only after the
decode grid's last CTA ended, and the traced build computing what the plain one does."""

import numpy as np
import pytest
import torch

from kvlab.cache import filled_cache
from kvlab.kernels import loader
from kvlab.kernels.decode import DecodePlan
from kvlab.kernels.timeline import KERNELS, MAX_CTAS, SLOTS, Launch, Tracer, median_phases, phases
from kvlab.timing import Timer


def records(kernel: str, rows: list[list[int]], sm=None) -> np.ndarray:
    """Records as a kernel writes them: slot 0 the SM, then its stamps (absolute ns)."""
    out = np.zeros((len(rows), SLOTS), dtype=np.uint64)
    for i, row in enumerate(rows):
        out[i, 0] = i if sm is None else sm[i]
        out[i, 1:1 + len(row)] = row
    assert len(rows[0]) == len(KERNELS[kernel][1])
    return out


T = 10**12  # a %globaltimer reading: ns since some epoch


def test_stamps_count_from_the_first_entry_and_missing_ones_are_minus_one():
    launch = Launch.from_records("decode", records("decode", [
        [T + 500, T + 1300, T + 1500, T + 3500, T + 20500, T + 21500],
        [T + 100, T + 900, 0, 0, 0, 0],  # a CTA past its sequence's end: stops when ready
    ]))
    assert launch.t0 == T + 100
    assert launch.stamps["entry"].tolist() == [400, 0]
    assert launch.stamps["ready"].tolist() == [1200, 800]
    assert launch.stamps["end"].tolist() == [21400, -1]
    assert launch.sm.tolist() == [0, 1]
    merge = Launch.from_records("merge", records("merge", [[T + 200, T + 22000, T + 22900,
                                                            T + 23100]]), t0=launch.t0)
    assert merge.stamps["released"].tolist() == [21900]
    assert set(launch.to_dict()) == {"sm", *KERNELS["decode"][1]}


def test_a_launch_without_stamps_is_refused():
    with pytest.raises(RuntimeError, match="wrote no stamps: was it built with KVLAB_TIMELINE"):
        Launch.from_records("read", np.zeros((4, SLOTS), dtype=np.uint64))


def test_phases_sum_up_a_step():
    decode = Launch.from_records("decode", records("decode", [
        [T, T + 800, T + 1000, T + 3000, T + 20000, T + 21000],
        [T + 200, T + 1000, T + 1400, T + 3400, T + 22400, T + 23000],
        [T + 100, T + 900, 0, 0, 0, 0],
    ]))
    merge = Launch.from_records("merge", records("merge", [
        [T + 900, T + 23700, T + 24600, T + 24900],
        [T + 950, T + 23800, T + 24800, T + 25000],
    ]), t0=decode.t0)
    read = Launch.from_records("read", records("read", [[T, T + 15000], [T + 300, T + 18000]]))
    p = phases(decode, merge, read)
    assert p["decode_ctas"] == 3 and p["decode_ctas_done"] == 2
    assert p["decode_span_us"] == 23.0 and p["decode_first_end_us"] == 21.0
    assert p["ready_us"] == 0.8 and p["issued_us"] == 1.1 and p["landed_us"] == 3.1
    assert p["loop_us"] == 18.0 and p["epilogue_us"] == 0.8
    assert p["merge_released_after_us"] == 0.7 and p["merge_end_after_us"] == 2.0
    assert p["merge_loads_us"] == 0.95 and p["merge_rest_us"] == 0.25
    assert p["step_span_us"] == 25.0
    assert p["read_span_us"] == 18.0 and p["read_first_end_us"] == 15.0
    unsplit = phases(decode, None, read)
    assert unsplit["step_span_us"] == unsplit["decode_span_us"]
    assert "merge_ctas" not in unsplit
    # a merge CTA whose sequence had one partition stops at once: left out of the merge's phases
    idle = Launch.from_records("merge", records("merge", [
        [T + 900, T + 23700, T + 24600, T + 24900], [T + 300, 0, 0, 0]]), t0=decode.t0)
    some = phases(decode, idle, read)
    assert some["merge_ctas"] == 2 and some["merge_ctas_merging"] == 1
    assert some["merge_released_after_us"] == 0.7 and some["merge_first_entry_us"] == 0.3
    assert median_phases([p, {**p, "loop_us": 30.0}, {**p, "loop_us": 10.0}])["loop_us"] == 18.0


def test_defined_builds_apart_and_checks_names():
    assert loader.compile_options()[-1].startswith("-I")
    with loader.defined("KVLAB_TIMELINE"):
        with loader.defined("OTHER_1"):
            assert loader.compile_options()[-2:] == ("-DKVLAB_TIMELINE", "-DOTHER_1")
        assert loader.compile_options()[-1] == "-DKVLAB_TIMELINE"
    assert not any(o.startswith("-D") for o in loader.compile_options())
    for bad in ("kvlab", "A=1", "", 3):
        with pytest.raises(ValueError, match="must be a name of capitals, digits and _"):
            with loader.defined(bad):
                pass


def traced(num_seqs: int, context: int, num_kv_heads: int = 8, group: int = 4):
    cache, ids, _ = filled_cache(num_seqs, context, 16, num_kv_heads, 128, layout="hnd",
                                 dtype=torch.float16)
    q = torch.randn(num_seqs, num_kv_heads * group, 128, device="cuda", dtype=torch.float16)
    kv_bytes = 2 * num_seqs * context * num_kv_heads * 128 * 2
    return cache, ids, q, Tracer(cache, ids, num_kv_heads * group, kv_bytes)


@pytest.mark.gpu
@pytest.mark.parametrize("num_seqs, context", [(1, 8192), (16, 1024)])
def test_a_traced_step_stamps_every_cta_in_the_order_of_its_work(num_seqs, context):
    cache, ids, q, tracer = traced(num_seqs, context)
    timer = Timer("cuda", num_runs=1)
    out = torch.empty_like(q)
    decode, merge = tracer.trace_gqa(q, out, timer, spin=100_000)
    read = tracer.trace_read(timer, spin=100_000)
    launcher = tracer.plan.launcher
    assert decode.sm.size == np.prod(launcher.decode_grid)
    assert (merge is None) == (launcher.num_partitions == 1)
    if num_seqs == 1:
        assert merge is not None and merge.sm.size == 32  # a CTA a query head
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    d = decode.stamps
    order = [d[n] for n in KERNELS["decode"][1]]
    assert (order[0] >= 0).all()
    assert all((b >= a).all() for a, b in zip(order, order[1:], strict=False))
    assert ((decode.sm >= 0) & (decode.sm < num_sms)).all()
    if merge is not None:
        m = merge.stamps
        # a programmatic dependent: released only once every decode CTA has ended
        assert (m["released"] >= d["end"].max()).all()  # equal lengths, split: every CTA merges
        assert ((m["loaded"] >= m["released"]) & (m["end"] >= m["loaded"])).all()
    assert read.sm.size == tracer.read.num_ctas
    assert (read.stamps["end"] >= read.stamps["entry"]).all()
    plain = DecodePlan(cache, ids, q.shape[1], "gqa").run(q)
    assert torch.equal(plain, out)  # the stamps change nothing the kernel computes
    assert phases(decode, merge, read)["decode_ctas_done"] == decode.sm.size


@pytest.mark.gpu
def test_a_launch_past_the_timeline_is_refused_before_the_read_is_allocated():
    num_seqs = MAX_CTAS // 8 + 1  # 8 KV heads: a CTA each, 8 more than a timeline holds
    cache, ids, _ = filled_cache(num_seqs, 16, 16, 8, 128, layout="hnd", dtype=torch.float16)
    kv_bytes = 2 * num_seqs * 16 * 8 * 128 * 2
    before = torch.cuda.memory_allocated()
    with pytest.raises(ValueError, match=rf"the decode launch has {8 * num_seqs} CTAs: a "
                                         rf"timeline holds at most {MAX_CTAS}"):
        Tracer(cache, ids, 32, kv_bytes)
    assert torch.cuda.memory_allocated() - before < kv_bytes  # the plan's tables, no read
