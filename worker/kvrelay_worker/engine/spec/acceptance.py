"""How often a sequence's drafts are accepted, learned from its verifications.

Drafts are accepted one after another until the first rejection, so a verification of
``p`` drafts that accepts ``a`` says: ``a`` acceptances, and one rejection if ``a < p``.
The per-draft acceptance probability is then acceptances / (acceptances + rejections),
with recent verifications weighing more (decayed counts) and a prior worth a couple of
drafts, so a new request starts hopeful and a request whose guesses keep failing soon
reads as poor.
"""

from __future__ import annotations

from dataclasses import dataclass

PRIOR_RATE = 0.5
PRIOR_WEIGHT = 2.0
DECAY = 0.9


@dataclass
class Acceptance:
    """Decayed acceptance and rejection counts of one sequence's drafts."""

    accepted: float = PRIOR_RATE * PRIOR_WEIGHT
    rejected: float = (1.0 - PRIOR_RATE) * PRIOR_WEIGHT

    @property
    def rate(self) -> float:
        return self.accepted / (self.accepted + self.rejected)

    def observe(self, proposed: int, accepted: int) -> None:
        self.accepted = self.accepted * DECAY + accepted
        self.rejected = self.rejected * DECAY + (1.0 if accepted < proposed else 0.0)
