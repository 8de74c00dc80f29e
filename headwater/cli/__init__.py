"""The ``headwater`` command-line interface (typer + rich).

Layout: :mod:`~headwater.cli.main` holds the root command, the global options and the
error handling; :mod:`~headwater.cli.queues` the ``queue`` commands;
:mod:`~headwater.cli.records` ``produce``, ``scan``, ``get`` and ``find``;
:mod:`~headwater.cli.consume` ``consume``; :mod:`~headwater.cli.status` ``status``;
:mod:`~headwater.cli.shell` the interactive ``shell``; :mod:`~headwater.cli.serve` ``serve``;
:mod:`~headwater.cli.check` ``check``;
:mod:`~headwater.cli.output` tables and JSON lines; :mod:`~headwater.cli.parse` the
parsing of times, positions and lists; :mod:`~headwater.cli.context` the one function that
opens a client (:func:`~headwater.cli.context.open_client`). The user guide is
``docs/cli.md``.
"""
