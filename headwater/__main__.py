"""``python -m headwater``: the ``headwater`` command, for environments without its script
on PATH (``python -m headwater serve --data DIR`` is ``headwater serve --data DIR``)."""

from headwater.cli.main import main

if __name__ == "__main__":
    main()
