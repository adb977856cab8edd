"""Speculative decoding: cheap guesses of the next tokens, verified by the target model.

A proposer (``ngram_index.py``: the request's own prompt and output, then the worker's
recent outputs; ``draft_model.py``: a smaller model) guesses up to k tokens for a decoding
sequence; the step runs the target model on the sequence's next token and the guesses in
one pass, and ``verification.py`` keeps the longest prefix of guesses the target itself
would have produced, plus the target's own token after it. ``policy.py`` decides per step
which sequences speculate and how far, from measured acceptance and step costs, so that
speculation is skipped when the batch is already compute-bound. ``speculator.py`` ties
them to the engine.
"""
