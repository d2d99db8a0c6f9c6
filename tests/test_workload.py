"""Workload: validation, generator ranges and determinism, shared prefixes, synthetic token ids."""

import warnings

import numpy as np
import pytest
from factories import make_workload_of

from kvlab.workload import (
    DISTRIBUTIONS,
    lognormal,
    lognormal_lengths,
    make_workload,
    shared_prefix,
    uniform,
)


def test_workload_converts_to_read_only_int64():
    w = make_workload_of([3, 5], [0, 2], 8)
    assert w.prompt_lens.dtype == np.int64 and not w.prompt_lens.flags.writeable
    assert w.num_requests == 2
    assert w.seq_lens.tolist() == [3, 7]
    assert w.prefix_group.tolist() == [-1, -1]
    assert w.prefix_lens.shape == (0,)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (
            dict(prompt_lens=[0, 4], output_lens=[1, 1], max_seq_len=8),
            r"prompt_lens\[0\]=0: must be >= 1",
        ),
        (dict(prompt_lens=[2, 4], output_lens=[1, -1], max_seq_len=8), r"output_lens\[1\]=-1"),
        (dict(prompt_lens=[2, 4], output_lens=[1], max_seq_len=8), r"output_lens: shape"),
        (
            dict(prompt_lens=[2, 7], output_lens=[1, 2], max_seq_len=8),
            r"seq_lens\[1\]=9: must be <= max_seq_len=8",
        ),
        (dict(prompt_lens=[2.0], output_lens=[1], max_seq_len=8), r"prompt_lens: dtype float64"),
        (dict(prompt_lens=[2], output_lens=[1], max_seq_len=0), r"max_seq_len=0"),
        (
            dict(
                prompt_lens=[2], output_lens=[1], max_seq_len=8, prefix_group=[1], prefix_lens=[2]
            ),
            r"prefix_group\[0\]=1: must be -1 or in \[0, 1\)",
        ),
        (
            dict(
                prompt_lens=[2], output_lens=[1], max_seq_len=8, prefix_group=[0], prefix_lens=[3]
            ),
            r"prompt_lens\[0\]=2: must be >= its shared prefix",
        ),
        (
            dict(
                prompt_lens=[2], output_lens=[1], max_seq_len=8, prefix_group=[-1], prefix_lens=[0]
            ),
            r"prefix_lens\[0\]=0",
        ),
    ],
)
def test_workload_rejects_bad_fields(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_workload_of(**kwargs)


def test_uniform_stays_in_ranges_and_is_seeded():
    w = uniform(500, prompt_len=(3, 9), output_len=(0, 4), seed=7)
    assert w.prompt_lens.min() == 3 and w.prompt_lens.max() == 9
    assert w.output_lens.min() == 0 and w.output_lens.max() == 4
    assert w.max_seq_len == 13
    again = uniform(500, prompt_len=(3, 9), output_len=(0, 4), seed=7)
    assert np.array_equal(w.prompt_lens, again.prompt_lens)
    other = uniform(500, prompt_len=(3, 9), output_len=(0, 4), seed=8)
    assert not np.array_equal(w.prompt_lens, other.prompt_lens)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_requests=0), r"num_requests=0: must be >= 1"),
        (dict(num_requests=4, prompt_len=(0, 3)), r"prompt_len\[0\]=0: must be >= 1"),
        (dict(num_requests=4, prompt_len=(5, 3)), r"prompt_len=\(5, 3\): lo must be <= hi"),
        (dict(num_requests=4, output_len=7), r"output_len=7: must be a \(lo, hi\) pair"),
        (
            dict(num_requests=4, prompt_len=(1, 4), output_len=(0, 4), max_seq_len=7),
            r"max_seq_len=7: must be >= prompt_len\[1\] \+ output_len\[1\] = 8",
        ),
    ],
)
def test_uniform_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        uniform(**kwargs)


def test_lognormal_clips_into_max_seq_len():
    w = lognormal(2000, prompt_median=300, output_median=200, sigma=1.5, max_seq_len=1024, seed=1)
    assert w.seq_lens.max() <= 1024 and w.prompt_lens.min() >= 1 and w.output_lens.min() >= 0
    assert 200 < np.median(w.prompt_lens) < 400  # the median survives clipping of the tails
    flat = lognormal(5, prompt_median=30, output_median=20, sigma=0.0, max_seq_len=64)
    assert flat.prompt_lens.tolist() == [30] * 5 and flat.output_lens.tolist() == [20] * 5


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(prompt_median=0), r"prompt_median=0"),
        (dict(output_median=5000), r"output_median=5000: must be in \[1, max_seq_len=4096\]"),
        (dict(sigma=-0.5), r"sigma=-0.5: must be >= 0"),
    ],
)
def test_lognormal_rejects_bad_arguments(kwargs, match):
    args = dict(num_requests=4, prompt_median=100, output_median=100) | kwargs
    with pytest.raises(ValueError, match=match):
        lognormal(**args)


def test_shared_prefix_prepends_to_a_fraction_of_requests():
    base = uniform(200, prompt_len=(1, 50), output_len=(0, 20), seed=3)
    w = shared_prefix(base, shared_fraction=0.3, prefix_len=17, num_prefixes=3, seed=4)
    shared = w.prefix_group >= 0
    assert shared.sum() == 60
    assert set(w.prefix_group[shared].tolist()) == {0, 1, 2}
    assert w.prefix_lens.tolist() == [17, 17, 17]
    assert np.array_equal(w.prompt_lens, base.prompt_lens + 17 * shared)
    assert np.array_equal(w.output_lens, base.output_lens)
    assert w.max_seq_len == base.max_seq_len + 17


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(shared_fraction=1.5), r"shared_fraction=1.5: must be in \[0, 1\]"),
        (dict(prefix_len=0), r"prefix_len=0: must be >= 1"),
        (dict(num_prefixes=0), r"num_prefixes=0"),
    ],
)
def test_shared_prefix_rejects_bad_arguments(kwargs, match):
    args = dict(shared_fraction=0.5, prefix_len=8) | kwargs
    with pytest.raises(ValueError, match=match):
        shared_prefix(uniform(4), **args)


def test_shared_prefix_rejects_a_base_that_already_shares():
    once = shared_prefix(uniform(4), 0.5, 8)
    with pytest.raises(ValueError, match="base has 1 prefix groups"):
        shared_prefix(once, 0.5, 8)


def test_token_ids_share_exactly_the_group_prefix():
    w = make_workload_of(
        [5, 6, 4, 3], [2, 0, 1, 0], 8, prefix_group=[0, 1, 0, -1], prefix_lens=[4, 6]
    )
    ids = [w.token_ids(i) for i in range(w.num_requests)]
    assert [len(t) for t in ids] == w.seq_lens.tolist()
    assert ids[0][:4] == ids[2][:4]
    # Apart from the group prefixes, no token id occurs twice in the workload.
    rest = ids[0] + ids[1] + ids[2][4:] + ids[3]
    assert len(set(rest)) == len(rest)
    with pytest.raises(IndexError, match=r"i=4: must be in \[0, 4\)"):
        w.token_ids(4)


@pytest.mark.parametrize("distribution", sorted(DISTRIBUTIONS))
@pytest.mark.parametrize("max_seq_len", [64, 4096, 32768])
def test_make_workload_fits_max_seq_len_at_any_shared_fraction(distribution, max_seq_len):
    for fraction in (0.0, 0.5, 1.0):
        w = make_workload(distribution, 300, max_seq_len, fraction, prefix_len=max_seq_len // 4)
        assert w.max_seq_len == max_seq_len
        assert w.seq_lens.max() <= max_seq_len
        assert (w.prefix_group >= 0).sum() == round(300 * fraction)


def test_make_workload_rejects_bad_arguments():
    with pytest.raises(ValueError, match=r"distribution='zipf': must be one of"):
        make_workload("zipf", 10, 128)
    with pytest.raises(ValueError, match=r"prefix_len=128: must be in \[0, max_seq_len=128\)"):
        make_workload("uniform", 10, 128, 0.5, prefix_len=128)


def test_lognormal_lengths_have_about_the_mean_and_stay_under_the_max():
    lens = lognormal_lengths(4096, 3200, 16384)
    assert lens.dtype == np.int64 and lens.min() >= 1 and lens.max() <= 16384
    assert 2900 < lens.mean() < 3200  # the clip at 16k takes a little off the mean
    assert np.array_equal(lens, lognormal_lengths(4096, 3200, 16384))  # seeded
    with pytest.raises(ValueError, match=r"mean=5000: must be in \[1, max_len=4096\]"):
        lognormal_lengths(4, 5000, 4096)


def test_batch_shape_of_one_context_and_of_mixed_lengths():
    from kvlab.workload import batch_shape

    assert batch_shape(4, 1024) == (1024, 1024, 4096, {})
    shape, context, tokens, mixed = batch_shape(8, "lognormal:512,2048")
    lengths = lognormal_lengths(8, 512, 2048)
    assert shape == lengths.tolist() and tokens == int(lengths.sum())
    assert context == round(float(lengths.mean()))
    assert mixed == {"lengths": "lognormal:512,2048", "max_context": int(lengths.max())}


# -- hostile inputs: each refused naming its parameter, before any allocation -----------------

def test_batch_shape_refuses_batches_and_contexts_that_are_not_counts():
    from kvlab.workload import MAX_NUM_REQUESTS, batch_shape

    for batch in (-1, 0, 2.5, True, MAX_NUM_REQUESTS + 1):
        with pytest.raises(ValueError, match=f"batch={batch!r}"):
            batch_shape(batch, 128)
    for shape in (0, -4, 2.5, 2**62, None):
        with pytest.raises(ValueError, match=f"shape={shape!r}"):
            batch_shape(4, shape)
    assert batch_shape(np.int64(4), np.int32(16)) == (16, 16, 64, {})


@pytest.mark.parametrize("sigma", [float("inf"), float("nan"), -1.0, True, "1"])
def test_sigma_must_be_a_finite_number_at_least_0(sigma):
    for make in (lambda: lognormal_lengths(4, 10, 20, sigma=sigma),
                 lambda: lognormal(4, 10, 10, sigma=sigma)):
        with pytest.raises(ValueError, match=r"sigma=.*: must be >= 0, a finite number"):
            make()


def test_a_huge_sigma_clips_into_range_without_overflow():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no invalid casts
        w = lognormal(64, 10, 10, sigma=1e300, max_seq_len=100)
        lens = lognormal_lengths(64, 10, 100, sigma=1e200)
    assert set(w.prompt_lens.tolist()) <= {1, 10, 100} and w.seq_lens.max() <= 100
    assert lens.min() >= 1 and lens.max() <= 100


def test_lognormal_lengths_name_num_seqs():
    with pytest.raises(ValueError, match=r"num_seqs=-1: must be >= 1"):
        lognormal_lengths(-1, 10, 20)
    with pytest.raises(ValueError, match=r"num_seqs=2.5: must be an int >= 1"):
        lognormal_lengths(2.5, 10, 20)


@pytest.mark.parametrize("max_len", [2**31, 2**70])
def test_lengths_past_int32_are_refused(max_len):
    with pytest.raises(ValueError, match=f"max_len={max_len}: must be <= 2147483647"):
        lognormal_lengths(4, 10, max_len)
    with pytest.raises(ValueError, match=f"max_seq_len={max_len}: must be <= 2147483647"):
        lognormal(4, 10, 10, max_seq_len=max_len)


@pytest.mark.parametrize("text", ["lognormal:²,16", "lognormal:٣,16", "lognormal:1,9" + "9" * 40,
                                  "lognormal:10,2147483648", "lognormal:1_0,20", 5, None])
def test_lognormal_spec_refuses_what_int_cannot_take(text):
    from kvlab.workload import lognormal_spec

    with pytest.raises(ValueError, match="must be lognormal:MEAN,MAX with integers"):
        lognormal_spec(text)


def test_lognormal_spec_takes_ascii_digits_with_spaces():
    from kvlab.workload import lognormal_spec

    assert lognormal_spec("lognormal: 3200 , 16384") == (3200, 16384)
    assert lognormal_spec("lognormal:1,2147483647") == (1, 2**31 - 1)


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(prompt_lens=[2**62], output_lens=[2**62], max_seq_len=2**31 - 1),
     r"prompt_lens\[0\]=4611686018427387904: must be <= 2147483647"),
    (dict(prompt_lens=[1], output_lens=[2**63 - 1], max_seq_len=8),
     r"output_lens\[0\]=9223372036854775807: must be <= 2147483647"),
    (dict(prompt_lens=np.array([2**64 - 1], dtype=np.uint64), output_lens=[0], max_seq_len=8),
     r"prompt_lens\[0\]=18446744073709551615: must be <= 2147483647"),
    (dict(prompt_lens=[1], output_lens=[0], max_seq_len=8,
          prefix_group=np.array([2**64 - 1], dtype=np.uint64), prefix_lens=[]),
     r"prefix_group\[0\]=18446744073709551615"),
    (dict(prompt_lens=[1], output_lens=[0], max_seq_len=2**63), r"max_seq_len=9223372036854775808"),
    (dict(prompt_lens=[1], output_lens=[0], max_seq_len=8.0), r"max_seq_len=8.0: must be an int"),
])
def test_workload_refuses_lengths_that_would_overflow(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_workload_of(**kwargs)


def test_token_ids_take_an_integer_index():
    w = make_workload_of([3, 5], [0, 2], 8)
    for i in (1.5, True, "1"):
        with pytest.raises(ValueError, match=f"i={i!r}: must be an integer in \\[0, 2\\)"):
            w.token_ids(i)
    assert w.token_ids(np.int64(1)) == w.token_ids(1)


@pytest.mark.parametrize(("make", "match"), [
    (lambda: uniform(2**40), r"num_requests=1099511627776: must be <= 16777216"),
    (lambda: uniform(4, prompt_len=(1, 2**62)), r"prompt_len\[1\]=4611686018427387904: must be <="),
    (lambda: uniform(4, prompt_len=(1, 2**31 - 1), output_len=(0, 1)),
     r"prompt_len\[1\] \+ output_len\[1\] = 2147483648: must be <= 2147483647"),
    (lambda: uniform(4, seed=-1), r"seed=-1: must be an integer >= 0"),
    (lambda: uniform(4, seed=1.5), r"seed=1.5: must be an integer >= 0"),
    (lambda: lognormal(4, 10, 10, seed="x"), r"seed='x': must be an integer >= 0"),
    (lambda: shared_prefix(uniform(4), float("nan"), 4), r"shared_fraction=nan: must be in"),
    (lambda: shared_prefix(uniform(4), True, 4), r"shared_fraction=True: must be in \[0, 1\]"),
    (lambda: shared_prefix(uniform(4), "0.5", 4), r"shared_fraction='0.5': must be in \[0, 1\]"),
    (lambda: shared_prefix(uniform(4), 0.5, 2**70), r"prefix_len=1180591620717411303424: must "
                                                    r"be <= 2147482111"),
    (lambda: shared_prefix(uniform(4), 0.5, 4, num_prefixes=2**40), r"num_prefixes=1099511627776"),
    (lambda: shared_prefix("uniform", 0.5, 4), r"base='uniform': must be a Workload"),
    (lambda: make_workload("uniform", 4, 2**63), r"max_seq_len=9223372036854775808: must be <="),
    (lambda: make_workload("uniform", 4, 100, float("nan"), 10), r"shared_fraction=nan"),
    (lambda: make_workload(["uniform"], 4, 100), r"distribution=\['uniform'\]: must be one of"),
    (lambda: make_workload("uniform", 4, 100, seed=-2), r"seed=-2: must be an integer >= 0"),
])
def test_generators_refuse_hostile_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()


# -- FlashInfer's production length mix --------------------------------------------------------

@pytest.mark.parametrize("num_seqs", [1, 6, 7, 64, 100, 128])
def test_production_lengths_give_each_length_its_weights_share(num_seqs):
    from kvlab.workload import PRODUCTION_MIX, production_lengths

    lens = production_lengths(num_seqs, 131072)
    assert lens.dtype == np.int64 and len(lens) == num_seqs
    counts = {length: int((lens == length).sum()) for length, _ in PRODUCTION_MIX}
    assert sum(counts.values()) == num_seqs  # nothing but the mix's lengths
    for length, weight in PRODUCTION_MIX:  # largest remainder: within one of the exact share
        assert abs(counts[length] - num_seqs * weight / 100) < 1
    assert np.array_equal(lens, production_lengths(num_seqs, 131072))  # seeded


def test_production_lengths_of_100_are_the_weights_and_scale_to_max_len():
    from kvlab.workload import production_lengths

    lens = production_lengths(100, 32768)
    values, counts = np.unique(lens, return_counts=True)
    assert values.tolist() == [1024, 2048, 4096, 8192, 16384, 32768]
    assert counts.tolist() == [35, 20, 15, 12, 10, 8]
    assert sorted(production_lengths(6, 32).tolist()) == [1, 1, 2, 4, 8, 16]  # 4k scales to 1
    assert not np.array_equal(production_lengths(100, 32768, seed=1), lens)  # shuffled


def test_mixed_spec_reads_both_forms_and_names_both_when_refusing():
    from kvlab.workload import (
        batch_shape,
        describe_mixed,
        mixed_lengths,
        mixed_spec,
        production_lengths,
    )

    assert mixed_spec("production:32768") == ("production", (32768,))
    assert mixed_spec("lognormal:3200,16384") == ("lognormal", (3200, 16384))
    assert np.array_equal(mixed_lengths(8, "lognormal:512,2048"), lognormal_lengths(8, 512, 2048))
    # 4 of 128..4096: shares 1.4, 0.8, 0.6, 0.48, 0.4, 0.32; the largest remainders take 256-1024
    assert sorted(mixed_lengths(4, "production:4096").tolist()) == [128, 256, 512, 1024]
    assert batch_shape(4, "production:4096")[3] == {"lengths": "production:4096",
                                                   "max_context": 1024}
    assert "1024, 2048, 4096, 8192, 16384, 32768 weighted 35, 20" in describe_mixed(
        "production:32768")
    for text in ("production:31", "production:", "production:1,2", "production:٣٢", "zipf:3",
                 "production:" + "9" * 11, None):
        with pytest.raises(ValueError, match=r"must be lognormal:MEAN,MAX .* or production:MAX "
                                             r"\(an integer in \[32, 2147483647\]\)"):
            mixed_spec(text)
    with pytest.raises(ValueError, match=r"max_len=16: must be >= 32"):
        production_lengths(4, 16)
