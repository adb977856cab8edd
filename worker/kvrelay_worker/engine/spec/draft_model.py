"""A draft model: a second, smaller model that guesses the target's next tokens.

It keeps its own paged KV cache, run by the same machinery as the target's (a
``ModelRunner`` and a ``KVCacheManager`` without prefix caching), and a shadow
``Sequence`` per target sequence holding the tokens its cache has seen. Before each
proposal the shadow takes the target's tokens and keeps its KV only for the prefix they
share (the drafts the target accepted); the rest is recomputed. Guesses are the draft's
argmax: one token per position, which ``verification.py`` turns into exact output.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence as Seq

import torch

from kvrelay_worker.engine.config import EngineConfig
from kvrelay_worker.engine.errors import EngineConfigError
from kvrelay_worker.engine.kv.kv_cache import KVCacheManager
from kvrelay_worker.engine.options import QUANTIZATIONS
from kvrelay_worker.engine.runner.model_runner import ModelRunner
from kvrelay_worker.engine.runner.transfer import host_to_device
from kvrelay_worker.engine.sched.scheduler_output import ScheduledSequence
from kvrelay_worker.engine.sched.sequence import Sequence
from kvrelay_worker.models.decoder import CausalLM

log = logging.getLogger(__name__)

# Stands for a guess still on the device (``propose`` fills each in before returning).
_PLACEHOLDER = -1

# Weight quantizations a draft can be loaded with (``draft:<model>@int4``).
DRAFT_QUANTIZATIONS = tuple(q for q in QUANTIZATIONS if q not in ("none", "auto"))


def split_draft_quantization(name: str) -> tuple[str, str]:
    """``"smollm2@int4"`` -> ``("smollm2", "int4")``; no known suffix -> ``(name, "none")``."""
    base, sep, suffix = name.rpartition("@")
    if sep and base and suffix in DRAFT_QUANTIZATIONS:
        return base, suffix
    return name, "none"


class DraftModel:
    """Greedy drafts from a smaller model with the target's vocabulary."""

    def __init__(self, model: CausalLM, config: EngineConfig, num_blocks: int) -> None:
        # The draft's cache follows ``kv_cache_dtype`` like the target's: the engine sized
        # both pools together at that dtype (``kv_sizing.decide_num_blocks``).
        self.runner = ModelRunner(model, config.block_size, config.torch_device,
                                  config.torch_dtype, config.torch_kv_cache_dtype)
        self.runner.allocate_kv_cache(num_blocks)
        self.kv = KVCacheManager(num_blocks, config.block_size, False, "draft",
                                 sliding_window=model.config.kv_window)
        self._shadows: dict[int, Sequence] = {}
        self._bases: dict[int, int] = {}  # target length when the shadow last proposed

    @classmethod
    def of_model(cls, model: CausalLM, config: EngineConfig, vocab_size: int,
                 num_blocks: int, name: str = "draft") -> DraftModel:
        """A draft around ``model`` (built by ``engine_model.load_draft_model`` or given),
        refused unless it shares the target's vocabulary."""
        if model.config.vocab_size != vocab_size:
            raise EngineConfigError(
                f"draft model {name!r} has a vocabulary of {model.config.vocab_size} tokens, "
                f"the target {vocab_size}: a draft must share the target's tokenizer")
        log.info("speculative decoding with draft model %s", name)
        return cls(model, config, num_blocks)

    def forget(self, seq: Sequence) -> None:
        shadow = self._shadows.pop(seq.seq_id, None)
        self._bases.pop(seq.seq_id, None)
        if shadow is not None:
            self.kv.free(shadow)

    @torch.inference_mode()
    def propose(self, seqs: Seq[Sequence], depths: Seq[int]) -> list[list[int]]:
        """Up to ``depths[i]`` greedy guesses after each of ``seqs`` (fewer when the
        draft's pool cannot hold them).

        The guesses stay on the device between the draft's forward passes, each feeding
        the next as its input ids, and come back to the host in ONE copy at the end (a
        read per draft token would make the host wait for the device each time). Which
        sequences go on depends on their depths and the pool alone, never on a guess, so
        the host needs none of them until then; the shadows hold placeholders meanwhile.
        """
        drafts: list[list[int]] = [[] for _ in seqs]
        live = [i for i, seq in enumerate(seqs) if self._catch_up(seq)]
        shadows = {i: self._shadows[seqs[i].seq_id] for i in live}
        order: list[int] = []  # the sequence of each guess, in the order they are made
        guesses: list[torch.Tensor] = []
        first = True
        while live:
            items = []
            for i in live:
                shadow = shadows[i]
                n = 1 if not first else shadow.num_tokens - shadow.num_computed_tokens
                items.append(ScheduledSequence(shadow, n))
            fed = None if first else self._previous_guesses(guesses[-1], order, live)
            step = self.runner.execute(items, fed).argmax(dim=-1)
            guesses.append(step)
            order.extend(live)
            still: list[int] = []
            for i, item in zip(live, items, strict=True):
                item.seq.num_computed_tokens += item.num_new_tokens
                drafts[i].append(_PLACEHOLDER)
                item.seq.token_ids.append(_PLACEHOLDER)
                if len(drafts[i]) < depths[i] and self.kv.allocate_slots(item.seq, 1):
                    still.append(i)
            live = still
            first = False
        if guesses:
            self._fill_in(torch.cat(guesses).tolist(), order, drafts, shadows)
        return drafts

    def _previous_guesses(self, last: torch.Tensor, order: list[int],
                          live: list[int]) -> torch.Tensor:
        """The last pass's guesses of the sequences in ``live`` (a subsequence of that
        pass's), as the next pass's input ids, still on the device."""
        previous = order[len(order) - last.shape[0]:]
        if previous == live:
            return last
        keep = torch.tensor([previous.index(i) for i in live], dtype=torch.int64)
        return last.index_select(0, host_to_device(keep, last.device))

    @staticmethod
    def _fill_in(values: list[int], order: list[int], drafts: list[list[int]],
                 shadows: dict[int, Sequence]) -> None:
        """Replace the placeholders, in order, with the guesses read back."""
        filled = dict.fromkeys(shadows, 0)
        for i, value in zip(order, values, strict=True):
            k = filled[i]
            drafts[i][k] = value
            shadow = shadows[i]
            shadow.token_ids[len(shadow.token_ids) - len(drafts[i]) + k] = value
            filled[i] = k + 1

    def _catch_up(self, seq: Sequence) -> bool:
        """Point the shadow at ``seq``'s tokens, keeping the KV of their shared prefix,
        and make room for what it must compute; False when the pool has no room."""
        shadow = self._shadows.get(seq.seq_id)
        target = seq.token_ids
        if shadow is None:
            shadow = Sequence(request_id=seq.request_id, choice_index=seq.choice_index,
                              token_ids=[], num_prompt_tokens=seq.num_prompt_tokens,
                              params=seq.params)
            self._shadows[seq.seq_id] = shadow
        base = self._bases.get(seq.seq_id, 0)
        kept = min(base, shadow.num_computed_tokens)
        for pos in range(base, min(shadow.num_computed_tokens, len(target))):
            if shadow.token_ids[pos] != target[pos]:
                break
            kept = pos + 1
        shadow.num_computed_tokens = min(kept, len(target) - 1)
        # Tokens before ``kept`` already equal the target's (token lists only grow): copy
        # the rest only, so a step costs the new tokens, not the whole context.
        del shadow.token_ids[kept:]
        shadow.token_ids.extend(target[kept:])
        self._bases[seq.seq_id] = len(target)
        self.kv.free_blocks_after(shadow, shadow.num_computed_tokens)
        return self.kv.allocate_slots(shadow, len(target) - shadow.num_computed_tokens)
