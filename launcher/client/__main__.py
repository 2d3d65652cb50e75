"""`python -m launcher.client`: see launcher/client/cli.py for the options."""

import sys

from launcher.client.cli import main

if __name__ == "__main__":
    sys.exit(main())
