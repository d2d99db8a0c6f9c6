import dataclasses

import numpy as np
import pytest

import kvlab
from kvlab import MODELS, ModelConfig
from kvlab.config import RopeScaling

PAPER_MODELS = ["llama2-7b", "llama2-13b", "llama3-8b", "qwen2.5-7b", "qwen2.5-14b",
                "opt-6.7b", "opt-13b", "opt-30b"]


def test_every_published_preset_is_there():
    assert set(PAPER_MODELS) <= set(MODELS)
    assert any(name.startswith("tiny-") for name in MODELS)


@pytest.mark.parametrize(
    ("name", "layers", "qo", "kv", "group", "kv_bytes_fp16"),
    [
        ("llama2-7b", 32, 32, 32, 1, 512 * 1024),  # the well-known 0.5 MiB per token
        ("llama3-8b", 32, 32, 8, 4, 128 * 1024),
        ("qwen2.5-7b", 28, 28, 4, 7, 56 * 1024),
        ("qwen2.5-14b", 48, 40, 8, 5, 192 * 1024),
        ("opt-30b", 48, 56, 56, 1, 2 * 48 * 7168 * 2),
    ],
)
def test_derived_values(name, layers, qo, kv, group, kv_bytes_fp16):
    model = MODELS[name]
    assert (model.num_layers, model.num_qo_heads, model.num_kv_heads) == (layers, qo, kv)
    assert model.gqa_group == group
    assert model.kv_bytes_per_token() == kv_bytes_fp16
    assert model.kv_bytes_per_token(dtype_bytes=4) == 2 * kv_bytes_fp16


def test_families():
    assert MODELS["opt-13b"].position == "learned" and MODELS["opt-13b"].qkv_bias
    assert MODELS["qwen2.5-7b"].qkv_bias and MODELS["qwen2.5-7b"].rope_theta == 1e6
    assert not MODELS["llama3-8b"].qkv_bias and MODELS["llama3-8b"].norm == "rmsnorm"
    for model in MODELS.values():
        assert model.hidden_size == model.q_size


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_kv_heads": 3}, "num_qo_heads=32: must be divisible by num_kv_heads=3"),
        ({"head_dim": 100},
         r"head_dim=100: must be an integer, one of \(64, 80, 96, 112, 128, 256\)"),
        ({"head_dim": 128.0}, r"head_dim=128.0: must be an integer, one of"),
        ({"num_layers": 32.0}, "num_layers=32.0: must be an integer >= 1"),
        ({"num_kv_heads": True}, "num_kv_heads=True: must be an integer >= 1"),
        ({"num_layers": 0}, "num_layers=0: must be an integer >= 1"),
        ({"norm": "batchnorm"}, "norm='batchnorm': must be one of"),
        ({"family": "gpt2"}, "family='gpt2': must be one of"),
        ({"rope_theta": None}, "rope_theta=None: must be set exactly when position='rope'"),
        ({"rope_theta": 0}, "rope_theta=0: must be a finite number > 0"),
        ({"rope_theta": float("nan")}, "rope_theta=nan: must be a finite number > 0"),
        ({"rope_theta": "abc"}, "rope_theta='abc': must be a finite number > 0"),
        ({"rope_theta": True}, "rope_theta=True: must be a finite number > 0"),
        ({"qkv_bias": "no"}, "qkv_bias='no': must be True or False"),
        ({"norm_eps": 0}, "norm_eps=0: must be a number in \\(0, 1\\) or None"),
        ({"rope_scaling": {"factor": 8}}, "rope_scaling=\\{'factor': 8\\}: must be None, or a "
         "RopeScaling"),
    ],
)
def test_presets_validate_themselves(change, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(MODELS["llama2-7b"], **change)


def test_norm_eps_defaults_to_the_families_and_rope_scaling_checks_itself():
    assert MODELS["llama2-7b"].norm_eps == 1e-6 and MODELS["opt-6.7b"].norm_eps == 1e-5
    with pytest.raises(ValueError, match="rope_scaling=.*position='rope'"):
        dataclasses.replace(MODELS["opt-6.7b"], rope_scaling=RopeScaling(8.0, 1.0, 4.0, 8192))
    with pytest.raises(ValueError, match="high_freq_factor=1.0 must be above low_freq_factor=1.0"):
        RopeScaling(8.0, 1.0, 1.0, 8192)
    with pytest.raises(ValueError, match="rope_scaling.factor=0: must be a number > 0"):
        RopeScaling(0, 1.0, 4.0, 8192)


def test_numpy_integer_sizes_are_accepted():
    sizes = {"num_layers": np.int64(16), "head_dim": np.int32(128)}
    model = dataclasses.replace(MODELS["llama2-7b"], **sizes)
    assert (model.num_layers, model.head_dim) == (16, 128)
    assert type(model.num_layers) is int and type(model.head_dim) is int


def test_configs_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        MODELS["llama2-7b"].num_layers = 1
    assert isinstance(MODELS["tiny-llama"], ModelConfig)


def test_model_table():
    table = kvlab.config.model_table()
    assert list(table.index) == list(MODELS) and table.index.name == "model"
    assert table.loc["llama3-8b", "KV KiB/token"] == 128
    assert table.loc["qwen2.5-7b", "group"] == 7
    m = MODELS["qwen2.5-14b"]
    assert table.loc["qwen2.5-14b"].to_dict() == {
        "family": "qwen2", "layers": m.num_layers, "hidden": m.hidden_size,
        "qo heads": m.num_qo_heads, "kv heads": m.num_kv_heads, "group": m.gqa_group,
        "head dim": m.head_dim, "KV KiB/token": m.kv_bytes_per_token() / 1024,
        "max context": m.max_position}


def table_px(table) -> int:
    """The width JupyterLab gives `table` where nothing wraps: a column of 8 px a character of
    its header or its widest value (13 px bold) and 14 px of padding. Measured in Chromium: 922 px
    for the names of ModelConfig's fields (estimated 924), 795 px for model_table's (788)."""
    columns = [[table.index.name, *table.index], *([c, *table[c]] for c in table.columns)]
    return sum(14 + 8 * max(len(str(cell)) for cell in column) for column in columns)


def test_model_table_fits_the_walkthrough_at_1000_px():
    """The walkthrough's output area in JupyterLab, measured in Chromium: 820 px at 1,000 px
    (the file browser closed), 848 px at 1,280 px (open, as the browser tests run it). With
    ModelConfig's field names the table took 922 px: 102 and 74 px too wide."""
    table = kvlab.config.model_table()
    assert table_px(table) <= 820 - 20
    fields = table.rename(columns=dict(zip(table.columns, (
        "family", "layers", "hidden", "num_qo_heads", "num_kv_heads", "gqa_group", "head_dim",
        "kv_KiB_per_token", "max_position"), strict=True)))
    assert table_px(fields) > 848
    assert kvlab.config.model_table([MODELS["tiny-llama"]]).index.tolist() == ["tiny-llama"]
