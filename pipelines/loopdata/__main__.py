"""``python -m loopdata`` = the ``loopdata`` console script."""

import sys

from .cli import main

sys.exit(main())
