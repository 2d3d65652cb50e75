import sys

from launcher.bench.cli import main

sys.exit(main())
