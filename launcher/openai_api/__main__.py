"""`python -m launcher.openai_api`: see launcher/openai_api/process.py for the options."""

import sys

from launcher.openai_api.process import main

if __name__ == "__main__":
    sys.exit(main())
