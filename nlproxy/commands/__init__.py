"""Subcommands of the ``nlproxy`` command line, one module each.

Each module defines ``NAME`` and ``HELP`` (str), ``add_arguments(parser)`` and ``run(args) -> int``.
``cli.py`` discovers them, so a new subcommand is a new module here and nothing else. A command
parses its flags, calls its logic (``operate/`` for the operator commands, ``daemon/`` for
``run``) and prints.
"""
