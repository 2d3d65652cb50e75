"""`python -m launcher.service RUN_DIR`: a service's router (launcher/service/controller.py)."""

import sys

from launcher.service.controller import main

sys.exit(main())
