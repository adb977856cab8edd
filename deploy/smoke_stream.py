"""The client half of deploy/smoke.sh: one streamed chat completion through the gateway with
the ``openai`` package; once tokens flow, the worker container that holds the job gets
SIGTERM (``docker stop``: it drains for KVRELAY_SHUTDOWN_GRACE, then hands the job back)
and the stream must finish on the other replica: every token asked for, ending by length,
and the text sent before the stop what an uninterrupted greedy run answers.

Run by smoke.sh with the stack up: python deploy/smoke_stream.py GATEWAY_URL REDIS_URL
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from openai import OpenAI

from kvrelay import Client

MODEL = "smollm2-135m-instruct"
PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."
MAX_TOKENS = 160
STOP_AFTER_CHUNKS = 12  # chunks streamed before the holder gets SIGTERM


@dataclass
class Streamed:
    text: str
    ttft_s: float
    seconds: float
    cut: int  # characters received when the action started (0: no action)


def holder(redis_url: str, timeout: float = 20.0) -> str:
    """The host (container id) of the worker that runs a job now, from the heartbeats."""
    deadline = time.monotonic() + timeout
    with Client(redis_url, model=MODEL) as client:
        while time.monotonic() < deadline:
            busy = [w.host for w in client.workers() if w.jobs_running > 0]
            if busy:
                return busy[0]
            time.sleep(0.2)
    raise SystemExit("no worker reported the job as running")


def stream(openai: OpenAI, action: threading.Thread | None = None) -> Streamed:
    """Stream the completion, starting ``action`` after STOP_AFTER_CHUNKS chunks; fail
    unless it ends by length with every token asked for."""
    start = time.monotonic()
    first, cut = 0.0, 0
    parts: list[str] = []
    finish, tokens = None, 0
    chunks = openai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": PROMPT}], stream=True,
        max_tokens=MAX_TOKENS, temperature=0, stream_options={"include_usage": True})
    for n, chunk in enumerate(chunks, 1):
        first = first or time.monotonic() - start
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        if action is not None and n == STOP_AFTER_CHUNKS:
            cut = len("".join(parts))
            action.start()
    if (finish, tokens) != ("length", MAX_TOKENS):
        raise SystemExit(f"the stream ended with {finish!r} after {tokens} tokens")
    return Streamed("".join(parts), first, time.monotonic() - start, cut)


def main(gateway_url: str, redis_url: str) -> int:
    openai = OpenAI(base_url=gateway_url, api_key="none", timeout=300)
    stopped: list[float] = []

    def stop_holder() -> None:
        container = holder(redis_url)
        print(f"SIGTERM to the worker holding the job: container {container}", flush=True)
        began = time.monotonic()
        subprocess.run(["docker", "stop", "-t", "60", container], check=True,
                       capture_output=True)
        stopped.append(time.monotonic() - began)

    stopper = threading.Thread(target=stop_holder)
    cut = stream(openai, stopper)
    stopper.join()
    if not stopped:
        raise SystemExit("the holder was not stopped")
    print(f"stream across the takeover: {MAX_TOKENS} tokens in {cut.seconds:.1f} s (TTFT "
          f"{cut.ttft_s:.2f} s); the stopped container exited {stopped[0]:.1f} s after SIGTERM")
    whole = stream(openai)
    print(f"the same request, uninterrupted, on the other worker: {whole.seconds:.1f} s "
          f"(TTFT {whole.ttft_s:.2f} s)")
    same = next((i for i, (a, b) in enumerate(zip(cut.text, whole.text)) if a != b),
                min(len(cut.text), len(whole.text)))
    if cut.text == whole.text:
        print(f"identical text ({len(cut.text)} chars): {cut.text[:70]!r}...")
        return 0
    # The new owner prefills the tokens already sent (the float GEMM) where the first one
    # decoded them (the integer dot), so greedy may part after the cut, never before it.
    print(f"the texts agree on {same} chars (the stop came after {cut.cut}), then part:\n"
          f"--- across the takeover:\n{cut.text}\n--- uninterrupted:\n{whole.text}")
    return 0 if same >= cut.cut else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
