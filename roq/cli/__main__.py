"""`python -m roq.cli`: the `roq` command."""

from roq.cli import main

if __name__ == "__main__":
    main()
