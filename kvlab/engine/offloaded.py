"""Generation with the KV cache in host memory, through the KVPR runtime (`LLM(..., offload=True)`).

A batch of prompts of one length runs together. Its prefill (`forward.run_prompts`, as many prompts
a pass as `LLM.max_prefill_tokens` holds) puts every layer's attention inputs X and K, V into a
host store (`kvlab.offload.host.HostStore`, pinned on a GPU). Each decode step is then a
`KVPRDecoder` step: per layer, the K, V of the first l cached tokens are recomputed on the GPU from
their X while the K, V of the rest cross the link, the two overlapped, and l is chosen again at
every step from the link and GPU rates (`kvlab.offload.loop.decode`; on a GPU the rates are
measured at the start of each generate and again when the step times drift from their prediction).

The store keeps one length for the whole batch, so its requests start and stop together: one
prompt length and one max_new_tokens for all, no arrivals; a request that meets its EOS keeps
decoding with the others, and its tokens after the EOS are dropped.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from kvlab.engine import forward
from kvlab.engine.generation import Generation, TokenLog, clock_ms
from kvlab.model.rope import RopeTable
from kvlab.offload.host import HostStore
from kvlab.offload.loop import decode
from kvlab.offload.profiler import DriftMonitor, profile
from kvlab.offload.runtime import KVPRDecoder
from kvlab.offload.scheduler import LinkAndCompute

ATTENTION = "kvpr"  # what Generation.attention says of these runs


def check_batch(requests, arrivals) -> None:
    """ValueError unless the requests can share one host store: one prompt length, one
    max_new_tokens, no arrival times."""
    lengths = sorted({len(r.prompt) for r in requests})
    if len(lengths) > 1:
        raise ValueError(f"prompts: lengths {lengths}; offload=True runs a batch of one prompt "
                         "length (the KVPR store keeps one length for the batch)")
    limits = sorted({r.max_new_tokens for r in requests})
    if len(limits) > 1:
        raise ValueError(f"max_new_tokens: {limits}; offload=True runs one limit for the whole "
                         "batch")
    if arrivals is not None:
        raise ValueError("arrivals: offload=True runs the batch at once (no serving run)")


@torch.no_grad()
def generate(llm, requests, sample: Callable, stop: int | None, rates: LinkAndCompute | None,
             on_finish: Callable[[int, int], None] | None):
    """The batch `requests` (checked by `check_batch`) on `llm`'s weights through KVPR: returns
    a Generation. `sample(logits [batch, vocab]) -> token ids [batch]` (a tensor on the
    logits' device); `rates`: the link and GPU rates that choose the split, None to measure
    them (GPU only)."""
    model, w, device = llm.model, llm.weights, llm.device
    batch, prompt_len = len(requests), len(requests[0].prompt)
    num_new = requests[0].max_new_tokens
    cuda = device.type == "cuda"
    store = HostStore(model, batch, prompt_len + num_new, llm.dtype, pinned=cuda)
    log = TokenLog(batch, stop, time.perf_counter(), on_finish)

    def take(token_ids: list[int]) -> None:
        for request, token in zip(requests, token_ids, strict=True):
            if not request.finish_reason:
                log.take(request, token)

    def keeper(rows: slice):
        def keep(i, x, k, v):  # the store is token-major: [layer, token, sequence, ...]
            for tensor, into in ((x, store.x), (k, store.k), (v, store.v)):
                into[i, :prompt_len, rows].copy_(
                    tensor.view(-1, prompt_len, *tensor.shape[1:]).transpose(0, 1))
        return keep

    start = clock_ms(device)
    per_pass = max(1, llm.max_prefill_tokens // prompt_len)  # prompts a prefill pass takes
    rope = (RopeTable.build(model, prompt_len, llm.dtype, device) if model.position == "rope"
            else None)  # the prompts' positions (the decoder makes its own for the store's)
    last = []
    for first in range(0, batch, per_pass):
        rows = slice(first, min(first + per_pass, batch))
        prompts = [torch.tensor(r.prompt, dtype=torch.long, device=device)
                   for r in requests[rows]]
        last += forward.run_prompts(model, w, prompts, rope, keeper(rows))
    store.length = prompt_len
    take([sample(row[None]).item() for row in last])  # one draw each, as the paged engine makes
    prefill_ms = clock_ms(device) - start

    step_ms, splits = [], []
    if num_new > 1:
        decoder = KVPRDecoder(model, w.layers, store, device, cuda_graphs=llm.offload_graphs)
        if rates is None:
            rates = profile(model, batch, prompt_len, device, decoder)

        def step(dec, hidden, split):
            """A decode step, its logits, sampling and the next step's input, timed together."""
            begin = clock_ms(device)
            ids = sample(forward.logits(model, w, dec.step(hidden, split)))
            take(ids.tolist())
            positions = torch.full((batch,), store.length, dtype=torch.long, device=device)
            following = forward.embed(model, w, ids, positions)
            return following, (clock_ms(device) - begin) / 1e3

        hidden = forward.embed(model, w, torch.tensor([r.tokens[0] for r in requests],
                                                      device=device),
                               torch.full((batch,), prompt_len, device=device))
        _, records, _ = decode(decoder, hidden, num_new - 1, rates, timed=step,
                               monitor=DriftMonitor() if cuda else None)
        step_ms, splits = [r.measured_ms for r in records], [r.l for r in records]
    return Generation([r.tokens for r in requests], [r.finish_reason for r in requests],
                      [prefill_ms] * batch, step_ms, [batch] * len(step_ms), 0, ATTENTION,
                      [0.0] * batch, log.first_token_s, log.finish_s, splits)
