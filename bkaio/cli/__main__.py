"""`python -m bkaio.cli` is the `bkaio` command."""

from __future__ import annotations

import sys

from bkaio.cli.main import main

sys.exit(main())
