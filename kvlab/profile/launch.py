"""The process Nsight Compute profiles: `python -m kvlab.profile.launch '<KernelSpecs as JSON>'`.

For each spec of the JSON list, in order: its cache (`kvlab.cache.filled_cache`: random K/V,
blocks scattered over the pool) and plan (which compiles the kernel), then ONE launch of its
decode kernel, the launch ncu profiles (kvlab.profile.ncu filters the decode kernels by name).
No warm-up launch: each launch is profiled cold anyway (ncu flushes the caches before it), and
what a first launch costs the host is not in its GPU counters. The plan and the launch are inside
`kvlab.kernels.green.sm_limit(spec.num_sms)`: with spec.num_sms, on a green context of that many
SMs, and the plan splits the work for the SMs the context really holds (`DecodePlan.num_sms`);
without, on the whole GPU.

It writes nothing to stdout (ncu's CSV goes there) and, after each launch, one line to stderr:
SMS_MARKER, the spec's index and the SMs its plan had (the constant lives with the ncu command
that relies on it, in kvlab.profile.ncu).
"""

import json
import sys

from kvlab.profile.ncu import SMS_MARKER


def main(argv: list[str] | None = None) -> int:
    """Launch each spec of argv[0] once; exit status 2 for a bad argument."""
    import torch

    from kvlab.cache import filled_cache
    from kvlab.kernels import KERNEL_FAMILIES
    from kvlab.kernels.decode import DecodePlan
    from kvlab.kernels.green import sm_limit
    from kvlab.profile.spec import KernelSpec

    argv = sys.argv[1:] if argv is None else argv
    try:
        if len(argv) != 1:
            raise ValueError(f"{len(argv)} arguments: expected one, a JSON list of KernelSpecs")
        fields = json.loads(argv[0])
        if not isinstance(fields, list) or not fields:
            raise ValueError(f"{argv[0]!r}: must be a non-empty JSON list of KernelSpecs")
        specs = [KernelSpec.from_json(json.dumps(f)) for f in fields]
    except ValueError as err:
        print(f"python -m kvlab.profile.launch: error: {err}", file=sys.stderr)
        return 2
    for index, spec in enumerate(specs):
        dtype = getattr(torch, spec.dtype)
        cache, seq_ids, _ = filled_cache(spec.batch, spec.context, spec.block_size,
                                         spec.num_kv_heads, spec.head_dim,
                                         layout=KERNEL_FAMILIES[spec.kernel].layout, dtype=dtype)
        q = torch.randn(spec.batch, spec.num_qo_heads, spec.head_dim, dtype=dtype,
                        device="cuda")
        out = torch.empty_like(q)
        torch.cuda.synchronize()  # K/V and q are written on the default stream, not sm_limit's
        with sm_limit(spec.num_sms):
            plan = DecodePlan(cache, seq_ids, spec.num_qo_heads, spec.kernel,
                              prefetch=spec.prefetch_config())
            plan.run(q, out=out)  # the profiled launch
            torch.cuda.synchronize()
        print(f"{SMS_MARKER}{index} {plan.num_sms}", file=sys.stderr, flush=True)
        del cache, plan, q, out
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
