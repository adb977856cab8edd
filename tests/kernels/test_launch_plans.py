"""Launches are planned once per model shape, and new batch shapes compile nothing.

- Every layer of every step asks for its attention launch: the part that depends on the
  model and device alone (tiles, pipeline depth, shared memory fit) is planned once, and
  planning allocates no tensor; only the split count follows the batch.
- The kernel arguments that change every step (the decode split count, the prefill
  sequence count, the GEMM's rows) are not specialised on: Triton would otherwise compile
  a new kernel for a value that is 1 or a multiple of 16, mid-serving. Read from the
  compiled-mode kernels (``TRITON_INTERPRET=0``), which exist without a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kvrelay_kernels.triton_kernels import launch_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> torch.device:
    monkeypatch.setattr(launch_config, "_shared_memory_optin", lambda index: 227 * 1024)
    monkeypatch.setattr(launch_config, "_sm_count", lambda index: 132)
    launch_config._decode_pipeline.cache_clear()
    launch_config._prefill_plan.cache_clear()
    return torch.device("cuda", 0)


def _decode(device: torch.device, num_seqs: int, max_seq_len: int
            ) -> launch_config.DecodeConfig:
    return launch_config.decode_config(num_seqs=num_seqs, num_heads=32, num_kv_heads=8,
                                       head_size=128, block_size=16, max_seq_len=max_seq_len,
                                       dtype=torch.bfloat16, device=device)


def test_planning_a_launch_allocates_no_tensor(fake_gpu: torch.device,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a launch plan allocated a tensor")

    monkeypatch.setattr(torch, "empty", refuse)
    _decode(fake_gpu, 4, 1000)
    launch_config.prefill_config(num_heads=32, num_kv_heads=8, head_size=128, block_size=16,
                                 dtype=torch.bfloat16, device=fake_gpu)


def test_the_model_s_part_of_a_plan_is_made_once(fake_gpu: torch.device) -> None:
    plans = [_decode(fake_gpu, seqs, length) for seqs in (1, 3, 16, 64)
             for length in (17, 500, 4096, 32768)]
    for _ in range(10):
        launch_config.prefill_config(num_heads=32, num_kv_heads=8, head_size=128,
                                     block_size=16, dtype=torch.bfloat16, device=fake_gpu)
    assert launch_config._decode_pipeline.cache_info().misses == 1
    assert launch_config._prefill_plan.cache_info().misses == 1
    assert len({p.num_splits for p in plans}) > 1, "the split count still follows the batch"
    assert len({(p.tile_n, p.num_stages, p.group_pad, p.head_pad) for p in plans}) == 1


def test_arguments_that_change_every_step_are_not_specialised_on() -> None:
    code = (
        "import json\n"
        "from kvrelay_kernels.triton_kernels import decode_attention as d, "
        "prefill_attention as p, quantized_matmul as q\n"
        "print(json.dumps({k.__name__: list(k.do_not_specialize) for k in ("
        "d._decode_split_kernel, d._decode_reduce_kernel, p._prefill_kernel, "
        "q._quantized_matmul_kernel)}))\n")
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300, check=True)
    names = json.loads(result.stdout.strip().splitlines()[-1])
    assert "num_splits" in names["_decode_split_kernel"]
    assert "num_splits" in names["_decode_reduce_kernel"]
    assert "num_seqs" in names["_prefill_kernel"]
    assert "M" in names["_quantized_matmul_kernel"]
