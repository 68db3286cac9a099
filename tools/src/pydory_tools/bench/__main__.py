"""``python -m pydory.bench``: see pydory.bench.cli."""

import sys

from pydory.bench.cli import main

sys.exit(main())
