"""`python -m migrate` is `accel-migrate`."""

from migrate.cli import main

main()
