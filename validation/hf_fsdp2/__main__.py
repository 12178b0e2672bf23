"""python -m validation.hf_fsdp2: the command line every harness has (validation/core/cli.py)."""

import sys

from ..core.cli import main
from .plugin import HARNESS

if __name__ == "__main__":
    sys.exit(main(HARNESS))
