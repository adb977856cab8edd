#!/usr/bin/env bash
# Prepare, on a machine where pip works, what benchmarks/gpu_check.sh needs on a GPU host
# that cannot install or download anything (python 3.12, x86-64; torch, triton and
# transformers already there):
#   .whl/                      wheels of msgspec, redis and gguf (the versions installed here)
#   .devdata/smollm2-tokenizer SmolLM2's tokenizer files, which the tiny test models use
# Both are git-ignored: carry them with the tree (about 5 MB together).
set -euo pipefail
PYTHON=${PYTHON:-.venv/bin/python}
version() { "$PYTHON" -c "import importlib.metadata as m; print(m.version('$1'))"; }
mkdir -p .whl .devdata/smollm2-tokenizer
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl \
  "msgspec==$(version msgspec)" "redis==$(version redis)" "gguf==$(version gguf)"
folder=$("$PYTHON" -c "from kvrelay_worker.models.model_cache import prepare_model; print(prepare_model('smollm2-135m-instruct', progress=False))")
for f in tokenizer.json tokenizer_config.json special_tokens_map.json chat_template.jinja; do
  [ -f "$folder/$f" ] && cp "$folder/$f" .devdata/smollm2-tokenizer/
done
du -sh .whl .devdata
