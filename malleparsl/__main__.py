"""``python -m malleparsl``: the same command line as ``malleparsl``."""

from malleparsl.cli import main

if __name__ == "__main__":
    main()
