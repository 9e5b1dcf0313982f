"""find.py: `python -m dhsa.torch.find FILE.py:FACTORY`, the same command as
`python -m dhsa.torch.check` (check.py) under the name of the function it
runs, find_square_intermediates."""

import sys

from .check import main

if __name__ == "__main__":
    sys.exit(main())
