"""``python -m edgepipe.planner.cli``: the ``edgepipe`` command."""

from edgepipe.planner.cli.main import main

raise SystemExit(main())
