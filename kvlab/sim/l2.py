"""L2Cache: a trace-driven model of one GPU's L2 (sector-filled, set-associative, LRU).

The geometry is the H200's; how lines map to sets and which line leaves are assumptions
(NVIDIA does not publish them), stated once here as named constants:

- One unified cache. NOTE: the H100/H200 L2 is two partitions, and an SM's reads from the far
  partition may be duplicated in the near one; the model ignores this, so it is an upper bound
  on the capacity that a kernel sees. The partitions do show in ncu's hit counters: a prefetch
  fills its sector's home partition only, and the fabric between them looks up again what an
  SM asks across it. `L2Result.near_hit_rate` and `ncu_hit_rate` read the one cache that way
  (FABRIC_LOOKUP_SHARE, NEAR_HOME_SHARE: measured).
- NUM_WAYS = 16 ways, LRU within a set: the associativity and the policy are assumptions.
- SET_INDEXES: "hash" (the default) spreads lines over the sets like the GPU's undisclosed
  address hash: a Fibonacci hash of the line address (its upper 32 bits of line * 2^64/phi),
  mapped onto the sets by a multiply-shift; "modulo" (line % num_sets) is for traces by hand.
- A demand read fills only the sectors it missed (NVIDIA's L2 fills 32-byte sectors).
- gqa's cp.async carry the `.L2::128B` hint, but its loads ask for whole lines (each warp's rows
  of a tile are contiguous and line-aligned), so the hint fills nothing a load does not ask for:
  they are plain loads here. Without prefetch gqa's loads share nothing, and ncu reads almost
  no hits (docs/l2-model.md).
- A bulk prefetch (`cp.async.bulk.prefetch.L2`) fills the sectors its byte range covers; a line
  prefetch (`prefetch.global.L2`) fills the whole 128-byte line of its address.
- Time: every request comes with a time in rounds (kvlab.sim.spec: one turn of every CTA slot,
  about one loop iteration of the kernel). A miss, demand or prefetch, starts a fill that is ready
  `fill_latency_rounds` later (0: at once). A request before then finds the sector "pending": it
  reads no DRAM (merged with the fill in flight) but is no hit. NOTE: this is how ncu's hit
  counters are read here (pending = miss), an assumption that benchmarks/l2_validation.py checks
  against the other reading.
  A prefetch of a pending sector does nothing. A pending sector may be evicted: its fill is
  dropped and a later request misses again.
- Prefetched lines enter at the MRU end like demand lines (no evict-first/evict-last classes).
"""

import math
from dataclasses import dataclass, fields
from numbers import Real

import numba
import numpy as np

from kvlab.checks import check_positive_int

L2_BYTES = 62_914_560  # the H200's L2: 60 MiB
LINE_BYTES = 128
SECTOR_BYTES = 32
SECTORS_PER_LINE = LINE_BYTES // SECTOR_BYTES
NUM_WAYS = 16  # ASSUMPTION (see the module docstring)
NUM_SETS = L2_BYTES // (LINE_BYTES * NUM_WAYS)  # 30,720
SET_INDEXES = ("hash", "modulo")
# ASSUMPTION, to calibrate against ncu: a DRAM-bound CTA issues one loop iteration's loads and
# waits for them, so (Little's law) a loaded fill takes under a round. In lockstep
# (TraceSpec.jitter_rounds = 0) requests come at whole rounds and every value in (0, 1] acts
# alike; with the CTAs' phases spread, siblings' hits fall as the latency grows.
FILL_LATENCY_ROUNDS = 0.5

# The H200's L2 is two partitions joined by a fabric: half the addresses an SM asks for live in
# the other partition, and the fabric looks those up again, loads and prefetches alike. A
# prefetch fills its sector's home partition only, so the first load of a prefetched sector
# homed across the fabric misses near and hits there. Both shares were read from ncu's
# per-source counters (lts__t_sectors_srcunit_ltcfabric) at one gqa launch, with and without a
# bulk prefetch, in a probe that no result file keeps; docs/l2-model.md checks the hit rates
# they give against the recorded counters.
FABRIC_LOOKUP_SHARE = 0.5  # fabric lookups per SM lookup
NEAR_HOME_SHARE = 0.5  # of the sectors an SM asks for, homed in its own partition

# Request kinds: what one (address, bytes) request of a trace does.
DEMAND = 0  # a load: sector misses are read from DRAM
PREFETCH = 1  # a bulk L2 prefetch: fills the sectors its range covers
PREFETCH_LINES = 2  # per-line L2 prefetches: fill the whole lines its range touches
KINDS = (DEMAND, PREFETCH, PREFETCH_LINES)

_FULL_MASK = (1 << SECTORS_PER_LINE) - 1
# The replay's blocking (speed only; results do not depend on it): lookups per sorted chunk, and
# the state of one group of sets kept within a core's L2 (bytes per way: tag and last use 16,
# bitmasks 2, ready times 32).
_CHUNK_LINES = 1 << 20
_GROUP_STATE_BYTES = 1 << 17
_WAY_STATE_BYTES = 50
# Memory: L2Cache refuses a geometry whose state (_WAY_STATE_BYTES a way: 24.6 MB for the H200)
# passes MAX_CACHE_BYTES; `access` refuses a request of more than MAX_REQUEST_BYTES (its lookups
# are sorted in one chunk: two 8-byte keys a line) and bytes from MAX_ADDRESS on.
MAX_CACHE_BYTES = 512 * 2**20
MAX_REQUEST_BYTES = _CHUNK_LINES * LINE_BYTES  # 128 MiB
MAX_ADDRESS = 2**62
_FIBONACCI = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio
_SHIFT = np.uint64(32)


@dataclass(frozen=True)
class L2Result:
    """What a trace did to the L2, in 32-byte sectors. Results of consecutive traces add (`+`).

    demand_hits, demand_pending, demand_misses: sectors of loads found in L2 and ready / found
    with their fill still in flight (no DRAM read, no hit) / read from DRAM (a new fill).
    prefetch_hits: prefetched sectors already in L2, ready or in flight (no DRAM read).
    prefetch_misses: prefetched sectors read from DRAM into L2.
    prefetch_used: prefetched sectors that a later load read (each counted once);
    prefetch_late: those of them whose fill the load found still in flight.
    prefetch_evicted_unused: prefetched sectors evicted before any load used them.
    """

    demand_hits: int = 0
    demand_pending: int = 0
    demand_misses: int = 0
    prefetch_hits: int = 0
    prefetch_misses: int = 0
    prefetch_used: int = 0
    prefetch_late: int = 0
    prefetch_evicted_unused: int = 0

    def __add__(self, other: "L2Result") -> "L2Result":
        return L2Result(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    @property
    def demand_sectors(self) -> int:
        return self.demand_hits + self.demand_pending + self.demand_misses

    @property
    def prefetch_sectors(self) -> int:
        return self.prefetch_hits + self.prefetch_misses

    @property
    def hit_rate(self) -> float:
        """Ready hits over the sectors of loads, prefetches excluded: what ncu reads as
        lts__t_sectors_srcunit_tex_op_read_lookup_hit over lts__t_sectors_srcunit_tex_op_read
        (`bench counters`: l2_read_hit_bytes / l2_read_bytes) in a single cache; pending loads
        are not hits (an assumption); `near_hit_rate` adds the partitions. 0.0 for an empty
        trace."""
        return self.demand_hits / self.demand_sectors if self.demand_sectors else 0.0

    @property
    def near_hit_rate(self) -> float:
        """`hit_rate` as the loads meet the two-partition L2 (what ncu's loads' counter reads):
        the first load of a ready prefetched sector homed across the fabric (1 -
        NEAR_HOME_SHARE of them) misses in its own partition. Without prefetch it is
        `hit_rate`. 0.0 for an empty trace."""
        if not self.demand_sectors:
            return 0.0
        first_uses = self.prefetch_used - self.prefetch_late  # ready: among demand_hits
        hits = self.demand_hits - (1 - NEAR_HOME_SHARE) * first_uses
        return hits / self.demand_sectors

    @property
    def lookup_hit_rate(self) -> float:
        """Hits over every sector the SMs asked of L2, loads AND prefetches, pending loads
        counted as misses (a prefetch's lookups miss: it comes first). 0.0 for an empty
        trace."""
        lookups = self.demand_sectors + self.prefetch_sectors
        hits = self.demand_hits + self.prefetch_hits
        return hits / lookups if lookups else 0.0

    @property
    def ncu_hit_rate(self) -> float:
        """The hit rate as ncu's headline lts__t_sector_hit_rate counts it on the H200: every
        lookup, the loads' in their own partition (hitting at `near_hit_rate`), the prefetches',
        and the fabric's, FABRIC_LOOKUP_SHARE of those, hitting as the loads do near. Without
        prefetch it is `hit_rate`. With a prefetch of every sector ahead of its load, for each
        load's sector: a load, a prefetch and a fabric lookup; half the loads hit near (gqa at
        distance 1) and half of the fabric's lookups hit, a third in all. 0.0 for an empty
        trace."""
        lookups = self.demand_sectors + self.prefetch_sectors
        if not lookups:
            return 0.0
        near = self.near_hit_rate
        fabric = FABRIC_LOOKUP_SHARE * lookups
        hits = near * self.demand_sectors + self.prefetch_hits + near * fabric
        return hits / (lookups + fabric)

    @property
    def dram_bytes(self) -> int:
        """Bytes read from DRAM: every new fill, demand or prefetch (no writes in decode)."""
        return (self.demand_misses + self.prefetch_misses) * SECTOR_BYTES


class L2Cache:
    """An L2 cache model that keeps its contents between `access` calls (it starts empty).

    num_sets, num_ways: geometry; the default is the H200's 60 MiB as 30,720 sets x 16 ways of
    128-byte lines. set_index: "hash" or "modulo" (see the module docstring).
    fill_latency_rounds: rounds (float >= 0) from a miss to its fill being ready; 0 makes every
    fill instant. Raises ValueError for a bad argument, and for a geometry whose state would take
    more than MAX_CACHE_BYTES (before allocating it).
    """

    def __init__(self, num_sets: int = NUM_SETS, num_ways: int = NUM_WAYS,
                 set_index: str = "hash", fill_latency_rounds: float = FILL_LATENCY_ROUNDS):
        check_positive_int("num_sets", num_sets)
        check_positive_int("num_ways", num_ways)
        if num_sets >= 1 << 32:
            raise ValueError(f"num_sets={num_sets}: must be < 2**32")
        state_bytes = int(num_sets) * int(num_ways) * _WAY_STATE_BYTES
        if state_bytes > MAX_CACHE_BYTES:
            raise ValueError(f"num_sets={num_sets} x num_ways={num_ways}: the cache's state "
                             f"would take {state_bytes / 2**20:,.0f} MiB ({_WAY_STATE_BYTES} "
                             f"bytes a way), more than MAX_CACHE_BYTES = "
                             f"{MAX_CACHE_BYTES // 2**20} MiB")
        if not isinstance(set_index, str) or set_index not in SET_INDEXES:
            raise ValueError(f"set_index={set_index!r}: must be one of {SET_INDEXES}")
        if (isinstance(fill_latency_rounds, bool) or not isinstance(fill_latency_rounds, Real)
                or not 0 <= fill_latency_rounds < math.inf):
            raise ValueError(f"fill_latency_rounds={fill_latency_rounds!r}: must be a finite "
                             f"number >= 0")
        self.num_sets, self.num_ways, self.set_index = int(num_sets), int(num_ways), set_index
        self.fill_latency_rounds = float(fill_latency_rounds)
        # [num_sets * num_ways] per way, a set's ways side by side: line address (-1 empty), last
        # use (a count of lookups), sector bitmasks: valid, and filled by a prefetch but not read
        # yet; [num_sets * num_ways, SECTORS_PER_LINE] float64
        # time (rounds) at which each valid sector's fill is ready.
        self._tags = np.full(self.num_sets * self.num_ways, -1, dtype=np.int64)
        self._last_use = np.zeros(self.num_sets * self.num_ways, dtype=np.int64)
        self._valid = np.zeros(self.num_sets * self.num_ways, dtype=np.uint8)
        self._prefetched = np.zeros(self.num_sets * self.num_ways, dtype=np.uint8)
        self._ready = np.zeros((self.num_sets * self.num_ways, SECTORS_PER_LINE))
        self._clock = np.zeros(1, dtype=np.int64)
        self._sets_per_group = max(1, _GROUP_STATE_BYTES // (_WAY_STATE_BYTES * self.num_ways))
        self._latest = -math.inf  # the time of the latest request (rounds)

    @property
    def size_bytes(self) -> int:
        return self.num_sets * self.num_ways * LINE_BYTES

    @property
    def time(self) -> float:
        """Rounds: when every fill started so far is ready (the latest request's time plus the
        fill latency; 0.0 before any). A next kernel's trace starts here."""
        return max(0.0, self._latest + self.fill_latency_rounds)

    def access(self, addrs, nbytes, kinds, times=None) -> L2Result:
        """Replays requests in order and returns what they did.

        addrs: [n] integer byte addresses >= 0; nbytes: [n] integer sizes in [1,
        MAX_REQUEST_BYTES] (or one int for all); addrs + nbytes < MAX_ADDRESS (2**62);
        kinds: [n] values of KINDS (or one for all); times: [n] finite times in rounds,
        nondecreasing and not before an earlier call's (or one for all; default: `self.time`, once
        every earlier fill is ready). Request i touches the sectors that overlap
        [addrs[i], addrs[i] + nbytes[i]). Raises ValueError before touching the cache.
        """
        addrs = _check_array("addrs", addrs, 0, MAX_ADDRESS)
        nbytes = _check_array("nbytes", nbytes, 1, MAX_REQUEST_BYTES, like=addrs)
        kinds = _check_array("kinds", kinds, 0, np.iinfo(np.int64).max, like=addrs)
        if kinds.size and kinds.max() > max(KINDS):
            raise ValueError(f"kinds={kinds.max()}: must be one of {KINDS}")
        if addrs.size and (addrs + nbytes).max() >= MAX_ADDRESS:  # no overflow: both bounded
            raise ValueError(f"addrs + nbytes={(addrs + nbytes).max()}: must be < 2**62")
        times = self._check_times(self.time if times is None else times, addrs)
        counts = np.zeros(len(fields(L2Result)), dtype=np.int64)
        _replay(addrs, nbytes, kinds.astype(np.uint8), times, self.fill_latency_rounds,
                self._tags, self._last_use, self._valid, self._prefetched, self._ready,
                self.num_ways, self.num_sets, self.set_index == "hash", self._sets_per_group,
                self._clock, counts)
        if times.size:
            self._latest = float(times[-1])
        return L2Result(*(int(c) for c in counts))

    def _check_times(self, value, addrs) -> np.ndarray:
        """`value` as a contiguous float64 array of addrs' shape (one value is broadcast)."""
        times = np.asarray(value)
        if times.dtype.kind not in "iuf" or times.shape not in ((), addrs.shape):
            raise ValueError(f"times: dtype={times.dtype}, shape={times.shape}: must be a number "
                             f"or a real array of shape {addrs.shape}")
        times = np.ascontiguousarray(np.broadcast_to(times, addrs.shape), dtype=np.float64)
        earlier = np.concatenate(([self._latest], times[:-1]))
        bad = np.flatnonzero(~(np.isfinite(times) & (times >= earlier)))
        if bad.size:
            i = bad[0]
            raise ValueError(f"times[{i}]={times[i]}: must be finite and >= {earlier[i]} (the "
                             f"time before it: times never go back)")
        return times


def _check_array(name: str, value, minimum: int, maximum: int, like=None) -> np.ndarray:
    """`value` as a contiguous int64 array, all in [minimum, maximum]: 1-D, or (given `like`) one
    value or an array of like's shape, broadcast to it."""
    array = np.asarray(value)
    if like is None:
        allowed, shape_ok = "a 1-D integer array", array.ndim == 1
    else:
        allowed = f"an integer or an integer array of shape {like.shape}"
        shape_ok = array.shape in ((), like.shape)
    if not np.issubdtype(array.dtype, np.integer) or not shape_ok:
        raise ValueError(f"{name}: dtype={array.dtype}, shape={array.shape}: must be {allowed}")
    if array.size and array.min() < minimum:
        raise ValueError(f"{name}={array.min()}: must be >= {minimum}")
    if array.size and array.max() > maximum:  # before the cast: uint64 past int64 stays big
        raise ValueError(f"{name}={array.max()}: must be <= {maximum}")
    return np.ascontiguousarray(np.broadcast_to(array, array.shape if like is None else
                                                like.shape), dtype=np.int64)


@numba.njit(cache=True)
def _num_sectors(mask):
    return (mask & 1) + ((mask >> 1) & 1) + ((mask >> 2) & 1) + ((mask >> 3) & 1)


@numba.njit(cache=True)
def _set_base(line, num_sets, num_ways, hashed):
    """Index of the first way of `line`'s set."""
    if hashed:
        h = (np.uint64(line) * _FIBONACCI) >> _SHIFT
        return np.int64((h * np.uint64(num_sets)) >> _SHIFT) * num_ways
    return (line % num_sets) * num_ways


@numba.njit(cache=True)
def _replay(addrs, nbytes, kinds, times, latency, tags, last_use, valid, prefetched, ready,
            num_ways, num_sets, hashed, sets_per_group, clock, counts):
    """The core loop: one tag lookup per (request, line); counts as in L2Result's fields.

    Sets share nothing, so only the order of each set's own lookups matters. Each chunk of
    about _CHUNK_LINES lookups is sorted (stably, by a counting sort) into groups of
    `sets_per_group` consecutive sets and replayed group by group: a group's state stays in the
    CPU's cache instead of every lookup touching a random set of the whole 60 MiB model.
    """
    # ceil_div, written out: compiled code cannot call kvlab.arith's plain Python
    num_groups = -(-num_sets // sets_per_group)
    group_stride = sets_per_group * num_ways
    offsets = np.empty(num_groups + 1, np.int64)
    first = 0
    while first < addrs.size:
        stop, total = first, 0  # requests [first, stop): at least one, about _CHUNK_LINES lines
        while stop < addrs.size and (total == 0 or total < _CHUNK_LINES):
            total += (addrs[stop] + nbytes[stop] - 1) // LINE_BYTES - addrs[stop] // LINE_BYTES + 1
            stop += 1
        offsets[:] = 0
        for i in range(first, stop):
            for line in range(addrs[i] // LINE_BYTES, (addrs[i] + nbytes[i] - 1) // LINE_BYTES + 1):
                offsets[_set_base(line, num_sets, num_ways, hashed) // group_stride + 1] += 1
        for g in range(num_groups):
            offsets[g + 1] += offsets[g]
        # each lookup as (line << 8 | kind << 4 | sector mask, time): the replay then reads two
        # arrays in order instead of the requests at random
        keys, key_times = np.empty(total, np.int64), np.empty(total, np.float64)
        for i in range(first, stop):
            start, end = addrs[i], addrs[i] + nbytes[i]
            for line in range(start // LINE_BYTES, (end - 1) // LINE_BYTES + 1):
                g = _set_base(line, num_sets, num_ways, hashed) // group_stride
                keys[offsets[g]] = line << 8 | np.int64(kinds[i]) << 4 | _sector_mask(
                    line, start, end, kinds[i])
                key_times[offsets[g]] = times[i]
                offsets[g] += 1
        # NOTE: the lookup is written out here, not called: numba counts references to arrays
        # passed to a function, two atomic operations per array and call, a third of the time
        for k in range(total):
            line, t = keys[k] >> 8, key_times[k]
            mask, kind = keys[k] & _FULL_MASK, keys[k] >> 4 & 0xF
            base = _set_base(line, num_sets, num_ways, hashed)
            way = -1
            for j in range(base, base + num_ways):
                if tags[j] == line:
                    way = j
                    break
            if way < 0:  # the line is not in L2: its set's LRU line leaves (fills in flight too)
                # NOTE: the oldest use first, then where it is: a branch per way on which is older
                # mispredicts half the time, and this runs on every miss
                oldest = last_use[base]
                for j in range(base + 1, base + num_ways):
                    oldest = min(oldest, last_use[j])
                way = base
                while last_use[way] != oldest:
                    way += 1
                counts[7] += _num_sectors(prefetched[way])
                tags[way] = line
                valid[way] = 0
                prefetched[way] = 0
            held = np.int64(valid[way])
            fresh, ready_mask = mask & (_FULL_MASK ^ held), 0  # fresh: sectors that start a fill
            for sector in range(SECTORS_PER_LINE):
                if (mask & held) >> sector & 1 and ready[way, sector] <= t:
                    ready_mask |= 1 << sector
                elif fresh >> sector & 1:
                    ready[way, sector] = t + latency
            hits, misses = _num_sectors(ready_mask), _num_sectors(fresh)
            pending = _num_sectors(mask & held) - hits
            if kind == DEMAND:
                used = mask & np.int64(prefetched[way])
                counts[0] += hits
                counts[1] += pending
                counts[2] += misses
                counts[5] += _num_sectors(used)
                counts[6] += _num_sectors(used & (_FULL_MASK ^ ready_mask))
                prefetched[way] &= _FULL_MASK ^ mask
            else:
                counts[3] += hits + pending
                counts[4] += misses
                prefetched[way] |= fresh
            valid[way] = held | mask
            clock[0] += 1
            last_use[way] = clock[0]
        first = stop


@numba.njit(cache=True)
def _sector_mask(line, start, end, kind):
    """The sectors of `line` that a request of `kind` for bytes [start, end) touches."""
    if kind == PREFETCH_LINES:
        return _FULL_MASK
    line_start = line * LINE_BYTES
    first = (max(start, line_start) - line_start) // SECTOR_BYTES
    last = (min(end, line_start + LINE_BYTES) - 1 - line_start) // SECTOR_BYTES
    return ((2 << last) - 1) ^ ((1 << first) - 1)
