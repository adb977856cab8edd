"""Mixture-of-experts MLP: one grouped matmul over all experts vs a loop over experts.

A Mixtral-shaped random model (8 experts, top 2; hidden 512, expert MLP 1024, 4 layers,
8/2 heads, SmolLM2's tokenizer and vocabulary) generates greedily on the CPU, float32:
batch 1 and 32 requests at once, 96-token prompts, 64 new tokens each. Both variants run
on the same model in the same process, alternating, median of ``--rounds``; the outputs
must be identical (the grouped path changes only how the matmuls are issued).

    python benchmarks/moe.py [--rounds 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from harness import print_report, write_result

CONFIG = {"vocab_size": 49152, "hidden_size": 512, "intermediate_size": 1024,
          "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
          "head_dim": 64, "model_type": "mixtral", "num_experts": 8,
          "num_experts_per_tok": 2, "moe_intermediate_size": 1024, "moe_layers": (True,) * 4}


def measure(rounds: int, threads: int) -> dict[str, Any]:
    import torch

    from kvrelay_worker import SamplingParams
    from kvrelay_worker.engine import LLM, EngineConfig, LLMEngine
    from kvrelay_worker.loading import load_model_source
    from kvrelay_worker.models.factory import build_model
    from kvrelay_worker.models.model_config import ModelConfig
    from kvrelay_worker.models.moe import SparseMoE

    torch.set_num_threads(threads)
    config = ModelConfig(**CONFIG)  # type: ignore[arg-type]
    model = build_model(config, None, torch.float32, torch.device("cpu"), max_position=1024)
    tokenizer = load_model_source("smollm2-135m-instruct").tokenizer
    engine = LLMEngine.from_model(EngineConfig(model="moe", device="cpu", dtype="float32"),
                                  model, tokenizer, model_id="moe")
    llm = LLM.from_engine(engine)
    experts = [m for m in model.modules() if isinstance(m, SparseMoE)]
    rng = random.Random(0)
    params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    rows = []
    for batch in (1, 32):
        prompts = [[rng.randrange(100, 40000) for _ in range(96)] for _ in range(batch)]
        times: dict[str, list[float]] = {"grouped": [], "loop": []}
        outputs: dict[str, list[list[int]]] = {}
        for round_index in range(rounds + 1):
            for variant in ("grouped", "loop"):
                for layer in experts:
                    layer.grouped = variant == "grouped"
                    layer.padded = False  # the loop baseline, whatever the batch
                engine.kv.pool.reset_prefix_cache()
                start = time.perf_counter()
                outs = llm.generate(prompts, params)
                if round_index:  # the first round warms up
                    times[variant].append(time.perf_counter() - start)
                outputs[variant] = [o.token_ids for o in outs]
        if outputs["grouped"] != outputs["loop"]:
            raise AssertionError(f"batch {batch}: grouped and loop outputs differ")
        tokens = 64 * batch
        row = {"batch": batch, "output_tokens": tokens}
        for variant, values in times.items():
            row[f"{variant}_tok_s"] = round(tokens / statistics.median(values), 1)
        row["speedup"] = round(row["grouped_tok_s"] / row["loop_tok_s"], 3)
        rows.append(row)
        print(row, flush=True)
    return {"model": CONFIG, "threads": threads, "rounds": rounds, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/results/moe.json")
    args = parser.parse_args()
    result = measure(args.rounds, args.threads)
    print_report(result)
    write_result(args.out, "moe", args, result)


if __name__ == "__main__":
    main()
