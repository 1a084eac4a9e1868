"""``python -m toolkit`` runs the ``toolkit`` command."""

from toolkit.cli import main

main()
