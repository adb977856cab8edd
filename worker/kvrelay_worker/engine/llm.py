"""``LLM``: the offline, in-process batch API over one engine."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from tqdm.auto import tqdm

from kvrelay_worker.cpu_threads import ThreadChoice, apply_cpu_threads
from kvrelay_worker.engine.chat import apply_chat_template
from kvrelay_worker.engine.config import EngineConfig
from kvrelay_worker.engine.llm_engine import LLMEngine, Prompt
from kvrelay_worker.engine.outputs import RequestOutput
from kvrelay_worker.engine.sampling_params import SamplingParams


class LLM:
    """Generate for many prompts at once, batched continuously by one engine.

    ``model`` is a known name (``kvrelay models``), a Hugging Face folder or a ``.gguf``
    file; other keyword arguments are ``EngineConfig`` fields. The defaults are the
    worker's, so a script runs as fast as ``kvrelay worker`` does: ``quantization="auto"``
    (a GGUF on CPU keeps its quantized blocks, as ``KVRELAY_QUANTIZATION`` does) and
    ``cpu_threads=None``: as ``KVRELAY_CPU_THREADS`` unset, torch's intra-op threads are
    left as ``OMP_NUM_THREADS`` asked, else lowered to the CPUs this process may use (by
    affinity and cgroup quota) when torch runs more; a lower count, such as a script's own
    ``torch.set_num_threads(2)``, stays. ``cpu_threads=N`` sets N.
    """

    def __init__(self, model: str = "smollm2-135m-instruct", *, device: str = "auto",
                 dtype: str = "auto", quantization: str | None = "auto",
                 cpu_threads: int | None = None, progress: bool = False,
                 **engine_options: Any) -> None:
        config = EngineConfig(model=model, device=device, dtype=dtype,
                              quantization=quantization, **engine_options)
        # Before the model loads: building it is the first torch work of this process.
        self.cpu_threads = apply_cpu_threads(cpu_threads, name="cpu_threads", keep_lower=True)
        self.engine = LLMEngine(config, progress=progress)
        self._ids = itertools.count()

    @classmethod
    def from_engine(cls, engine: LLMEngine) -> LLM:
        llm = cls.__new__(cls)
        llm.engine = engine
        llm.cpu_threads = ThreadChoice(None, "left as the engine's builder set it")
        llm._ids = itertools.count()
        return llm

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 *, use_tqdm: bool = False, priority: Sequence[int] | None = None
                 ) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in the prompts' order.

        A prompt is a string or a list of token ids; one ``SamplingParams`` applies to all
        prompts, or give a list with one per prompt. A request that makes an engine step
        fail raises ``RequestFailedError`` (the others are aborted with it).
        """
        batch = self._as_batch(prompts)
        params = self._as_params(sampling_params, len(batch))
        if priority is not None and len(priority) != len(batch):
            # Checked up front: a short list would otherwise fail half-way with IndexError.
            raise ValueError(f"got {len(priority)} priorities for {len(batch)} prompts")
        ids = []
        try:
            for i, (prompt, p) in enumerate(zip(batch, params, strict=True)):
                request_id = f"llm-{next(self._ids)}"
                self.engine.add_request(request_id, prompt, p,
                                        priority=priority[i] if priority else 0)
                ids.append(request_id)
            return self._run(ids, use_tqdm)
        except BaseException:
            for request_id in ids:
                self.engine.abort_request(request_id)
            self.engine.step()  # drain the aborts so the engine is clean
            raise

    def chat(self, messages: Sequence[dict[str, Any]] | Sequence[Sequence[dict[str, Any]]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             *, use_tqdm: bool = False, tools: Sequence[dict[str, Any]] | None = None,
             chat_template_kwargs: dict[str, Any] | None = None,
             reasoning_effort: str | None = None) -> list[RequestOutput]:
        """Apply the model's chat template to one conversation (or a list of them), with
        OpenAI-style ``tools`` and extra template variables (``engine/chat.py``)."""
        single = bool(messages) and isinstance(messages[0], dict)
        conversations: list[Any] = [messages] if single else list(messages)
        prompts = [apply_chat_template(self.tokenizer, c, tools=tools,
                                       template_kwargs=chat_template_kwargs,
                                       reasoning_effort=reasoning_effort)
                   for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    @staticmethod
    def _as_batch(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
        if isinstance(prompts, str):
            return [prompts]
        items = list(prompts)
        if items and all(isinstance(t, int) and not isinstance(t, bool) for t in items):
            return [items]  # type: ignore[list-item]
        return items  # type: ignore[return-value]

    @staticmethod
    def _as_params(params: SamplingParams | Sequence[SamplingParams] | None,
                   count: int) -> list[SamplingParams]:
        if params is None:
            return [SamplingParams()] * count
        if isinstance(params, SamplingParams):
            return [params] * count
        listed = list(params)
        if len(listed) != count:
            raise ValueError(f"got {len(listed)} SamplingParams for {count} prompts")
        return listed

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        results: dict[str, RequestOutput] = {}
        wanted = set(ids)
        bar = tqdm(total=len(ids), desc="generate", disable=not use_tqdm, unit="req")
        with bar:
            while len(results) < len(ids):
                for out in self.engine.step():
                    if out.error is not None and out.request_id in wanted:
                        raise out.error
                    if out.output is not None and out.request_id in wanted:
                        results[out.request_id] = out.output
                        bar.update(1)
        return [results[i] for i in ids]
