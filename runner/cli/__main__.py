"""``python -m runner.cli``: the ``runner`` command."""

from runner.cli import main

main()
