"""A few local sentences the quantization tools calibrate on (llmcompressor's AWQ in
``make_compressed_checkpoint.py``, GPTQModel's GPTQ and AWQ in
``make_gptqmodel_checkpoint.py``): no data set is downloaded. Both scripts run as files in
the tools' environment, where this folder is first on the path."""

CALIBRATION = [
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Paris is the capital of France, and Berlin is the capital of Germany.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "Water boils at one hundred degrees Celsius at sea level.",
    "Once upon a time, a small robot learned to paint the sky at night.",
    "The mitochondria is the powerhouse of the cell, producing energy.",
    "To bake bread, mix flour, water, salt and yeast, then let it rise.",
    "Large language models predict the next token given the previous ones.",
]
