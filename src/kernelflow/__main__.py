"""``python -m kernelflow``: the command line, the same as the ``kernelflow`` command.

``python -m kernelflow demo`` runs the main job (robust kernel regression on real data with
injected outliers); ``python -m kernelflow --help`` lists the commands.
"""

from __future__ import annotations

import sys

from kernelflow.cli import main

if __name__ == "__main__":
    sys.exit(main())
