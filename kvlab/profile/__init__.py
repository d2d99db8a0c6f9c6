"""Hardware counters of one decode-kernel launch, by Nsight Compute (`ncu`), and the L2-prefetch
paper's counters to set them beside.

`counters(KernelSpec(...))`, or a list of specs, profiles one launch of each spec's kvlab decode
kernel in one subprocess and returns a pandas DataFrame, one row per spec (kvlab.profile.ncu says
which counters and how they are taken); `kvlab.profile.paper` holds the paper's Table 5.2.
Importing this package, or making specs, loads neither torch nor pandas.
"""

from kvlab.profile.ncu import CountersError, counters, measure, measure_many
from kvlab.profile.spec import KernelSpec

__all__ = ["CountersError", "KernelSpec", "counters", "measure", "measure_many"]
