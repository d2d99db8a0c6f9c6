"""What each rank of tests/engine/test_tp.py runs. A module of its own on the tests' path
(pyproject's pythonpath), so that the spawned interpreters, which get the parent's sys.path, can
import it (pytest's importlib mode gives test files no importable name)."""

import torch
import torch.distributed as dist

import kvlab
from kvlab.engine import forward

PROMPT = [(37 * i + 11) % 1000 for i in range(21)]
FED = [5, 900, 17, 256, 3, 3]  # decode steps fed these tokens


def forced_logits(llm) -> torch.Tensor:
    """fp32 logits [7, vocab]: PROMPT's prefill, then a decode step per token of FED."""
    alloc = llm.manager.add_sequence(len(PROMPT), PROMPT)
    seq = alloc.seq_id
    rows = [forward.prefill(llm.local, llm.weights, llm.caches, [alloc], [torch.tensor(PROMPT)],
                            llm.rope, llm.runner.reduce)[0]]
    for token in FED:
        position = llm.manager.seq_len(seq)
        llm.manager.append(seq, 1, [token])
        slot = torch.tensor(llm.manager.slot_mapping(seq, position, position + 1))
        rows.append(forward.decode_step(
            llm.local, llm.weights, llm.caches, [], slot, torch.tensor([token]),
            torch.tensor([position]), llm.runner.attend([seq]), llm.rope, llm.runner.reduce)[0])
    llm.manager.free(seq)
    return torch.stack(rows)


def run(name: str, tensor_parallel: bool) -> dict:
    llm = kvlab.LLM(name, device="cpu", num_blocks=64, tensor_parallel=tensor_parallel)
    ahead = kvlab.LLM(name, device="cpu", num_blocks=64, tensor_parallel=tensor_parallel,
                      async_decode=True, weights=llm.weights)
    prompts = [PROMPT, PROMPT[:9], [4] * 40]
    result = {"logits": forced_logits(llm), "local": llm.local,
              "tokens": llm.generate(prompts, max_new_tokens=24).tokens,
              "ahead": ahead.generate(prompts, max_new_tokens=24).tokens,
              "sampled": llm.generate(prompts, max_new_tokens=8, temperature=1.0).tokens}
    try:
        llm.generate(prompts, max_new_tokens=2, arrivals=[0.0, 0.0, 0.1])
    except ValueError as err:
        result["arrivals"] = str(err)
    return result


def rank_main(rank: int, world: int, port: int, name: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        torch.save(run(name, tensor_parallel=True), f"{out}.{rank}")
    finally:
        dist.destroy_process_group()
