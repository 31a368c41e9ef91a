"""Imported first by `minillama/__init__.py`: a Python without the package's dependencies (the system one,
in the repository root) gets one line saying which Python to use, rather than a traceback ending in
`import einops`. Looks the modules up without importing them."""

import importlib.util
import sys

RUNTIME = ("torch", "einops", "safetensors", "tiktoken", "tqdm")

if missing := [m for m in RUNTIME if importlib.util.find_spec(m) is None]:
    raise ImportError(
        f"minillama needs {', '.join(missing)}, which this Python ({sys.executable}) lacks. In a checkout run "
        f"`.venv/bin/python -m minillama` (any `make` target creates .venv); elsewhere `pip install torch` and "
        f"then `pip install` the repository"
    )
