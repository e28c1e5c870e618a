"""``python -m subwabbit.engine``: run the engine program."""

import sys

from .program import main

sys.exit(main())
