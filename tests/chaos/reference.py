"""The tokens every job must stream, computed in-process where no fault can reach.

Each job's request is built by the SDK's own builder and turned into the engine's input
by the worker's own functions, so the reference sees exactly what a worker would. The
simulated engine's tokens depend only on the prompt, the choice and the position; the
tiny model's reference is the offline engine with each job's own sampling options
(greedy, or seeded: a seeded choice's tokens depend only on the seed, the position and
the logits, with other requests beside it and after a resume), with a pool too large to
preempt.
"""

from __future__ import annotations

from typing import Any

from chaos.schedule import PRESSURE, JobPlan, Schedule
from kvrelay.protocol import GenerateRequest
from kvrelay.request_builder import build_request
from kvrelay_worker.intake.job_request import prompt_ids_for, sampling_params_from

# Tokens per choice, per job index.
Reference = dict[int, list[list[int]]]


def job_options(job: JobPlan, model: str) -> dict[str, Any]:
    """The ``generate``/``stream`` keywords of a job (greedy or seeded, a fixed length)."""
    options: dict[str, Any] = {"model": model, "max_tokens": job.max_tokens, "n": job.n,
                               "temperature": job.temperature, "ignore_eos": True,
                               "priority": job.priority}
    if job.seed is not None:
        options["seed"] = job.seed
    if job.best_of is not None:
        options["best_of"] = job.best_of
    if job.queue_timeout is not None:
        options["queue_timeout"] = job.queue_timeout
    return options


def _request(job: JobPlan, model: str) -> GenerateRequest:
    request, _ = build_request(job.prompt, job_options(job, model), default_model=model)
    return request


def reference_tokens(schedule: Schedule, model_path: str | None = None) -> Reference:
    if schedule.scenario == PRESSURE:
        assert model_path is not None
        return _offline(schedule, model_path)
    return _simulated(schedule)


def _simulated(schedule: Schedule) -> Reference:
    from kvrelay_worker.simulated.engine import SimulatedEngine
    from kvrelay_worker.simulated.step_time import StepTimeModel

    engine = SimulatedEngine(StepTimeModel(0.0, 0.0), max_num_seqs=64)
    reference: Reference = {}
    for job in schedule.jobs:
        request = _request(job, schedule.model)
        ids = prompt_ids_for(request, engine.tokenizer, engine.vocab_size,
                             engine.max_model_len)
        engine.add_request(str(job.index), ids, sampling_params_from(request))
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished and out.output is not None:
                    reference[job.index] = [c.token_ids for c in out.output.choices]
    return reference


def _offline(schedule: Schedule, model_path: str) -> Reference:
    from kvrelay_worker.engine.llm import LLM

    llm = LLM(model_path, device="cpu", kv_cache_memory=64 << 20, swap_space_gib=0)
    engine = llm.engine
    prompts, params = [], []
    for job in schedule.jobs:
        request = _request(job, schedule.model)
        prompts.append(prompt_ids_for(request, engine.tokenizer, engine.vocab_size,
                                      engine.max_model_len))
        params.append(sampling_params_from(request))
    outputs = llm.generate(prompts, params)
    return {job.index: [c.token_ids for c in out.choices]
            for job, out in zip(schedule.jobs, outputs, strict=True)}
