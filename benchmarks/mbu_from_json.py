"""Recompute decode-step MBU from a stored ``decode_step.py`` JSON, counting bytes read.

    python benchmarks/mbu_from_json.py [benchmarks/measured/h200-decode-step.json]

Runs anywhere (no GPU). Rows written before ``weight_bytes_read`` existed carry
``weight_bytes``, every parameter including the 1.05 GB input-embedding table that a step
only looks rows up in; for those the table is replaced by the rows a step reads (the
model is the Llama-3-8B shape of ``decode_step.LLAMA3_8B``, bfloat16, untied).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from decode_step import LLAMA3_8B

_BF16 = 2


def weight_bytes_read(row: dict[str, Any]) -> float:
    if "weight_bytes_read" in row:
        return float(row["weight_bytes_read"])
    hidden, vocab = LLAMA3_8B["hidden_size"], LLAMA3_8B["vocab_size"]
    assert isinstance(hidden, int)
    assert isinstance(vocab, int)
    return float(row["weight_bytes"] - vocab * hidden * _BF16 + row["batch"] * hidden * _BF16)


def recompute(rows: list[dict[str, Any]]) -> list[dict[str, float]]:
    out = []
    for row in rows:
        read = weight_bytes_read(row) + row["kv_bytes_per_step"]
        copy = row["copy_gbps"] * 1e9
        out.append({"batch": row["batch"], "bytes_read": read,
                    "mbu_engine": read / (row["engine_step_ms"] / 1e3) / copy,
                    "mbu_model": read / (row["model_replay_ms"] / 1e3) / copy,
                    "stored_mbu_engine": row["mbu_engine"]})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="?", default="benchmarks/measured/h200-decode-step.json")
    args = parser.parse_args(argv)
    rows = json.loads(Path(args.json).read_text())["decode_step"]
    print(f"{'batch':>5} {'GB read':>8} {'MBU step':>9} {'MBU model':>10} {'stored step':>12}")
    for r in recompute(rows):
        print(f"{r['batch']:>5} {r['bytes_read'] / 1e9:>8.2f} {r['mbu_engine']:>9.3f} "
              f"{r['mbu_model']:>10.3f} {r['stored_mbu_engine']:>12.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
