"""python -m validation: the HF transformers harness's command line (validation/core/cli.py), with
`summary` and `readme` over every harness's records."""

import sys

from .core.cli import main
from .hf.plugin import HARNESS

if __name__ == "__main__":
    sys.exit(main(HARNESS, core=True))
