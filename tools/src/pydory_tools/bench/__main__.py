"""``python -m pydory_tools.bench``: see pydory_tools.bench.cli."""

import sys

from pydory_tools.bench.cli import main

sys.exit(main())
