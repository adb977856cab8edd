"""Turning the target's samples at the draft positions into accepted tokens.

The target scores a sequence's next token and its k drafts in one pass, giving k + 1
distributions p_0..p_k. Row j is sampled exactly as a step without speculation would
sample that output position (same processing, same position-keyed noise for a seeded
request). Draft j is accepted while every sample before it equalled its draft: the
output is then token for token what decoding without speculation would produce, for
greedy and seeded requests alike, and a failover that resumes mid-answer continues the
same tokens whatever drafts either worker guessed.

This is the rejection-sampling rule of Leviathan et al. / Chen et al. for proposers
that guess one token per position (q = one-hot at the draft d): accept d with
probability min(1, p(d)/q(d)) = p(d), else draw from the residual max(0, p - q),
normalised — p without d. Drawing t ~ p and accepting when t == d has exactly that law
(P(accept) = p(d); on a rejection t is distributed as p restricted to tokens other than
d), so the emitted tokens have the target's distribution. Both proposers here guess
one token per position (the draft model greedily), so this form is the whole rule.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq


def accepted_length(samples: Seq[int], drafts: Seq[int]) -> int:
    """How many leading drafts equal the target's samples at their positions.

    ``samples`` has one more entry than ``drafts`` (the position after the last draft).
    """
    if len(samples) != len(drafts) + 1:
        raise ValueError(f"{len(samples)} samples for {len(drafts)} drafts")
    n = 0
    for sample, draft in zip(samples, drafts, strict=False):
        if sample != draft:
            break
        n += 1
    return n
