"""Beam search: groups of sequences that share blocks, their candidate step, and what the
scheduler must do differently for a group (preempt, reseat, undo together)."""
