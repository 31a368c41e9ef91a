"""`python -m minillama.bench`: the benchmark's command line (`cli.py`), as `python -m minillama bench`."""

import sys

from .cli import main

sys.exit(main())
