"""`python -m launcher.frontend`: see launcher/frontend/process.py for the options."""

import sys

from launcher.frontend.process import main

if __name__ == "__main__":
    sys.exit(main())
