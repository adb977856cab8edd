#!/usr/bin/env bash
# Prepare, on a machine where pip works, what benchmarks/gpu_check.sh needs on a GPU host
# that cannot install or download anything (Python 3.12, x86-64; the packages it has are
# in benchmarks/gpu_host_packages.txt):
#   .whl/                      a wheel of each distribution in benchmarks/gpu_bundle.txt
#                              (the versions installed here)
#   .devdata/smollm2-tokenizer SmolLM2's tokenizer files, which the tiny test models use
# Both are git-ignored: carry them with the tree (a few MiB; gpu_check.sh --dry-run fails
# above 60 MiB). KVRELAY_GPU_BUNDLE=DIR writes them under DIR instead of the tree's root.
set -euo pipefail
PYTHON=${PYTHON:-.venv/bin/python}
BUNDLE=${KVRELAY_GPU_BUNDLE:-.}
cd "$(dirname "$0")/.."
WHEELS=$BUNDLE/.whl
TOKENIZER=$BUNDLE/.devdata/smollm2-tokenizer
specs=()
for name in $(sed 's/#.*//' benchmarks/gpu_bundle.txt); do
  version=$("$PYTHON" -c "import importlib.metadata as m; print(m.version('$name'))") || {
    echo "gpu_bundle: $name is not installed here (make install); its version is taken from here" >&2
    exit 1
  }
  specs+=("$name==$version")
done
rm -rf "$WHEELS" && mkdir -p "$WHEELS" "$TOKENIZER"
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$WHEELS" "${specs[@]}"
folder=$("$PYTHON" -c "from kvrelay_worker.loading import prepare_model; print(prepare_model('smollm2-135m-instruct', progress=False))")
for f in tokenizer.json tokenizer_config.json special_tokens_map.json chat_template.jinja; do
  if [ -f "$folder/$f" ]; then cp "$folder/$f" "$TOKENIZER/"; fi
done
du -sh "$WHEELS" "$TOKENIZER"
