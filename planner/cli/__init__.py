"""The ``edgepipe`` command line: :mod:`planner.cli.main` parses and dispatches to one
module per group of commands (planning, documents, measuring, running, reporting, demo)."""
