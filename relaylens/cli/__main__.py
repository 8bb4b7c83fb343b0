"""``python -m relaylens.cli ARGS``: the command line, as the ``relaylens`` console script runs it."""

import sys

from relaylens.cli import main

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
