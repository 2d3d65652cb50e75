"""python -m launcher.rank <run_dir>: run this process's rank (launcher/rank/main.py)."""

from launcher.rank.main import main

main()
