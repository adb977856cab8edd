"""From logits to tokens and text: the sampler and its per-batch tensors, penalties,
structured-output grammars, detokenizing and the stop conditions."""
