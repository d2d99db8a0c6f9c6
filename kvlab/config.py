"""Model shapes: the published dimensions of the models the lab studies, as plain data.

Only what the memory side of decoding needs: layer count, head layout, hidden and MLP sizes, and the
norm / activation / position family that a recomputation of K and V must reproduce.
"""

from dataclasses import dataclass

from kvlab.checks import (
    check_bool,
    check_head_dim,
    check_num_heads,
    check_positive_int,
    check_real,
)

FAMILIES = ("llama", "qwen2", "opt")
NORMS = ("rmsnorm", "layernorm")
ACTIVATIONS = ("silu", "relu")
POSITIONS = ("rope", "learned")
# the most of kvlab.LLM's ahead_bytes (the cross-kernel L2 prefetch), far past any L2: here, with
# no torch, for the command line and the profiler too
MAX_AHEAD_BYTES = 1 << 30


def _check_choice(name: str, value, allowed: tuple) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r}: must be one of {allowed}")


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3's rotary scaling (`rope_scaling` with rope_type "llama3" in a config.json): the
    frequencies of wavelengths above original_max_position / low_freq_factor are divided by
    `factor`, those below original_max_position / high_freq_factor kept, and those between
    blended."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position: int

    def __post_init__(self):
        for name in ("factor", "low_freq_factor", "high_freq_factor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"rope_scaling.{name}={value!r}: must be a number > 0")
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(f"rope_scaling: high_freq_factor={self.high_freq_factor} must be "
                             f"above low_freq_factor={self.low_freq_factor}")
        check_positive_int("rope_scaling.original_max_position", self.original_max_position)


@dataclass(frozen=True)
class ModelConfig:
    """One decoder-only transformer's shape. Validated on construction. norm_eps: the norms'
    epsilon (default the presets': 1e-5 for LayerNorm, 1e-6 for RMSNorm); rope_scaling: Llama
    3's rotary scaling, or None."""

    name: str
    family: str
    num_layers: int
    hidden_size: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position: int
    norm: str
    activation: str
    position: str
    qkv_bias: bool
    rope_theta: float | None = None
    norm_eps: float | None = None
    rope_scaling: RopeScaling | None = None

    def __post_init__(self):
        sizes = ("num_layers", "hidden_size", "intermediate_size", "vocab_size", "max_position")
        for name in sizes:
            check_positive_int(name, getattr(self, name))
        check_num_heads(self.num_qo_heads, self.num_kv_heads)
        check_head_dim(self.head_dim)
        _check_choice("family", self.family, FAMILIES)
        _check_choice("norm", self.norm, NORMS)
        _check_choice("activation", self.activation, ACTIVATIONS)
        _check_choice("position", self.position, POSITIONS)
        if (self.position == "rope") != (self.rope_theta is not None):
            raise ValueError(
                f"rope_theta={self.rope_theta!r}: must be set exactly when position='rope'"
            )
        if self.rope_theta is not None:
            check_real("rope_theta", self.rope_theta, 0, open_min=True)
            object.__setattr__(self, "rope_theta", float(self.rope_theta))
        check_bool("qkv_bias", self.qkv_bias)
        object.__setattr__(self, "qkv_bias", bool(self.qkv_bias))
        if self.norm_eps is None:
            object.__setattr__(self, "norm_eps", 1e-5 if self.norm == "layernorm" else 1e-6)
        elif (isinstance(self.norm_eps, bool) or not isinstance(self.norm_eps, (int, float))
              or not 0 < self.norm_eps < 1):
            raise ValueError(f"norm_eps={self.norm_eps!r}: must be a number in (0, 1) or None")
        if self.rope_scaling is not None and (self.position != "rope" or
                                              not isinstance(self.rope_scaling, RopeScaling)):
            raise ValueError(f"rope_scaling={self.rope_scaling!r}: must be None, or a "
                             "RopeScaling with position='rope'")
        for name in (*sizes, "num_qo_heads", "num_kv_heads", "head_dim"):
            object.__setattr__(self, name, int(getattr(self, name)))  # numpy ints become ints

    @property
    def gqa_group(self) -> int:
        """Query heads per KV head (1 for multi-head attention)."""
        return self.num_qo_heads // self.num_kv_heads

    @property
    def q_size(self) -> int:
        return self.num_qo_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Elements of K (or of V) per token and layer."""
        return self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """Bytes of K and V for one token over all layers."""
        return 2 * self.num_layers * self.kv_size * dtype_bytes

    def activation_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """Bytes of one layer's input activation for one token (what KVPR recomputes K, V from)."""
        return self.hidden_size * dtype_bytes


def model_table(models=None):
    """A pandas DataFrame, one row per preset (`models`: ModelConfigs; default every one of
    MODELS), indexed by model: family, layers, hidden (hidden_size), qo heads (num_qo_heads),
    kv heads (num_kv_heads), group (gqa_group), head dim (head_dim), KV KiB/token (K and V of
    one token over all layers, fp16) and max context (max_position, tokens).

    NOTE: short column names of words, so that the table is some 800 px wide in a notebook and
    its headers wrap where it has less room; `ModelConfig`'s field names would need 920 px."""
    import pandas as pd

    rows = [
        {
            "model": m.name, "family": m.family, "layers": m.num_layers, "hidden": m.hidden_size,
            "qo heads": m.num_qo_heads, "kv heads": m.num_kv_heads, "group": m.gqa_group,
            "head dim": m.head_dim, "KV KiB/token": m.kv_bytes_per_token() / 1024,
            "max context": m.max_position,
        }
        for m in (MODELS.values() if models is None else models)
    ]
    return pd.DataFrame(rows).set_index("model")


def _llama(name: str, *, family: str = "llama", **dims) -> ModelConfig:
    """A Llama-style preset (RMSNorm, SiLU MLP, RoPE; Qwen2 adds biases to Q, K, V)."""
    return ModelConfig(
        name, family, head_dim=dims["hidden_size"] // dims["num_qo_heads"], norm="rmsnorm",
        activation="silu", position="rope", qkv_bias=family == "qwen2", **dims,
    )


def _opt(name: str, *, num_qo_heads: int, max_position: int = 2048, vocab_size: int = 50272,
         **dims) -> ModelConfig:
    """An OPT preset (pre-LayerNorm, ReLU MLP, learned positions, biases, multi-head)."""
    return ModelConfig(
        name, "opt", num_qo_heads=num_qo_heads, num_kv_heads=num_qo_heads,
        head_dim=dims["hidden_size"] // num_qo_heads, vocab_size=vocab_size,
        max_position=max_position, norm="layernorm", activation="relu", position="learned",
        qkv_bias=True, **dims,
    )


# Published configurations (the models' config.json files on their hubs).
MODELS: dict[str, ModelConfig] = {
    m.name: m
    for m in (
        _llama("llama2-7b", num_layers=32, hidden_size=4096, num_qo_heads=32, num_kv_heads=32,
               intermediate_size=11008, vocab_size=32000, max_position=4096, rope_theta=1e4),
        _llama("llama2-13b", num_layers=40, hidden_size=5120, num_qo_heads=40, num_kv_heads=40,
               intermediate_size=13824, vocab_size=32000, max_position=4096, rope_theta=1e4),
        _llama("llama3-8b", num_layers=32, hidden_size=4096, num_qo_heads=32, num_kv_heads=8,
               intermediate_size=14336, vocab_size=128256, max_position=8192, rope_theta=5e5),
        _llama("qwen2.5-7b", family="qwen2", num_layers=28, hidden_size=3584, num_qo_heads=28,
               num_kv_heads=4, intermediate_size=18944, vocab_size=152064, max_position=32768,
               rope_theta=1e6),
        _llama("qwen2.5-14b", family="qwen2", num_layers=48, hidden_size=5120, num_qo_heads=40,
               num_kv_heads=8, intermediate_size=13824, vocab_size=152064, max_position=32768,
               rope_theta=1e6),
        _opt("opt-6.7b", num_layers=32, hidden_size=4096, num_qo_heads=32,
             intermediate_size=16384),
        _opt("opt-13b", num_layers=40, hidden_size=5120, num_qo_heads=40,
             intermediate_size=20480),
        _opt("opt-30b", num_layers=48, hidden_size=7168, num_qo_heads=56,
             intermediate_size=28672),
        # Tiny shapes for tests and CPU demos: one of each family, GQA group 2 and 3.
        _llama("tiny-llama", num_layers=2, hidden_size=256, num_qo_heads=4, num_kv_heads=2,
               intermediate_size=512, vocab_size=1024, max_position=512, rope_theta=1e4),
        _llama("tiny-qwen", family="qwen2", num_layers=2, hidden_size=384, num_qo_heads=6,
               num_kv_heads=2, intermediate_size=768, vocab_size=1024, max_position=512,
               rope_theta=1e6),
        _opt("tiny-opt", num_layers=2, hidden_size=256, num_qo_heads=4, intermediate_size=1024,
             max_position=512, vocab_size=1024),
    )
}
