"""The L2 model's kernel time: how long one decode launch takes, from what `simulate` says it
reads. An assumption, calibrated on the H200 by `benchmarks/l2_validation.py` (which also checks
it against the times measured at other SM counts and with prefetch):

    time = max(DRAM bytes / copy roofline of the SMs, load bytes / (L2 GB/s per SM x SMs))
           / efficiency of the kernel family + launch cost of the family

It has no term for what a prefetch costs the SMs (instructions, issue slots), so it predicts no
prefetch loss; CPI and stalls are not modelled at all (ncu measures them).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.checks import check_int, check_real
from kvlab.kernels import FAMILIES
from kvlab.sim.l2 import SECTOR_BYTES, L2Result


@dataclass(frozen=True)
class TimeModel:
    """The calibrated constants: l2_gbps_per_sm (one for the GPU, > 0), and per kernel family
    (`efficiency` > 0, `launch_us` >= 0: dicts keyed by family, the same families). Raises
    ValueError for a constant that is not a finite number in range, naming it."""

    l2_gbps_per_sm: float
    efficiency: dict[str, float]
    launch_us: dict[str, float]

    def __post_init__(self):
        check_real("l2_gbps_per_sm", self.l2_gbps_per_sm, 0, open_min=True)
        for name in ("efficiency", "launch_us"):
            value = getattr(self, name)
            if not isinstance(value, dict) or set(value) - set(FAMILIES):
                raise ValueError(f"{name}={value!r}: must be a dict keyed by families of "
                                 f"{FAMILIES}")
        if set(self.efficiency) != set(self.launch_us):
            raise ValueError(f"efficiency, launch_us: fitted for {sorted(self.efficiency)} and "
                             f"{sorted(self.launch_us)}: must be the same families")
        for family in self.efficiency:
            check_real(f"efficiency[{family!r}]", self.efficiency[family], 0, open_min=True)
            check_real(f"launch_us[{family!r}]", self.launch_us[family], 0)

    @classmethod
    def from_fit(cls, fit: dict) -> TimeModel:
        """From a fit as l2_validation.json's "time_model" holds it: {"l2_gbps_per_sm": ...,
        family: {"efficiency": ..., "launch_us": ...}, ...}. Raises ValueError for a fit of
        another shape or with a constant out of range."""
        if not isinstance(fit, dict) or "l2_gbps_per_sm" not in fit:
            raise ValueError(f"fit={fit!r}: must be a dict with l2_gbps_per_sm")
        families = [f for f in FAMILIES if f in fit]
        for f in families:
            if not isinstance(fit[f], dict) or {"efficiency", "launch_us"} - set(fit[f]):
                raise ValueError(f"fit[{f!r}]={fit[f]!r}: must be a dict with efficiency and "
                                 "launch_us")
        return cls(fit["l2_gbps_per_sm"], {f: fit[f]["efficiency"] for f in families},
                   {f: fit[f]["launch_us"] for f in families})

    @classmethod
    def recorded(cls) -> TimeModel:
        """The fit recorded in results/cpu/l2_validation.json (ValueError where it is absent,
        unreadable or holds no fit of the right shape)."""
        from kvlab.results import load_result

        return cls.from_fit(load_result("cpu", "l2_validation", keys={"time_model": dict})
                            ["time_model"])

    def predict_ms(self, family: str, dram_bytes: float, load_bytes: float, num_sms: int,
                   roofline_gbps: float) -> float:
        """The modelled time (ms) of one launch of `family` on num_sms SMs, whose copy roofline
        there is roofline_gbps. Raises ValueError for a family the fit lacks, bytes that are not
        finite numbers >= 0, num_sms not an integer >= 1, or a roofline not finite and > 0."""
        if not isinstance(family, str) or family not in self.efficiency:
            raise ValueError(f"family={family!r}: the time model is fitted for "
                             f"{sorted(self.efficiency)}")
        check_real("dram_bytes", dram_bytes, 0)
        check_real("load_bytes", load_bytes, 0)
        check_int("num_sms", num_sms, 1)
        check_real("roofline_gbps", roofline_gbps, 0, open_min=True)
        dram_s = dram_bytes / (roofline_gbps * 1e9)
        l2_s = load_bytes / (self.l2_gbps_per_sm * num_sms * 1e9)
        return 1e3 * max(dram_s, l2_s) / self.efficiency[family] + self.launch_us[family] * 1e-3

    def predict_result_ms(self, family: str, result: L2Result, num_sms: int,
                          roofline_gbps: float) -> float:
        """`predict_ms` for what `simulate` returned (ValueError as `predict_ms`, or for a
        result that is not an L2Result)."""
        if not isinstance(result, L2Result):
            raise ValueError(f"result={result!r}: must be a kvlab.sim.L2Result")
        return self.predict_ms(family, result.dram_bytes, result.demand_sectors * SECTOR_BYTES,
                               num_sms, roofline_gbps)


def copy_roofline_gbps(num_sms: int, measured: dict[int, float]) -> float:
    """The copy roofline on num_sms SMs from the ones measured (`measured`: SMs -> GB/s):
    linear between the two measured SM counts around it; below the fewest, in proportion to the
    SMs; above the most, the most's (a copy is near-linear in SMs while few, and flat once HBM is
    busy). An interpolation, not a measurement, except at a measured count. Raises ValueError
    for num_sms not an integer >= 1, and for `measured` not a dict of at least one SM count (an
    integer >= 1) to a finite GB/s > 0."""
    check_int("num_sms", num_sms, 1)
    if not isinstance(measured, dict) or not measured:
        raise ValueError(f"measured={measured!r}: needs at least one measured SM count")
    for sms, gbps in measured.items():
        check_int("measured's SM count", sms, 1)
        check_real(f"measured[{sms}]", gbps, 0, open_min=True)
    counts = sorted(measured)
    if num_sms <= counts[0]:
        return measured[counts[0]] * num_sms / counts[0]  # below the fewest: in proportion
    if num_sms >= counts[-1]:
        return measured[counts[-1]]
    hi = next(c for c in counts if c >= num_sms)
    lo = counts[counts.index(hi) - 1]
    w = (num_sms - lo) / (hi - lo) if hi != lo else 1.0
    return measured[lo] + w * (measured[hi] - measured[lo])
