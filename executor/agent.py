"""``torchrun`` for edgepipe's multi-host recipe, with an exit barrier that a lost host
cannot hold up (issue 27).

Once its local workers have finished, a torchrun agent waits at an *exit barrier* for
every agent of the job (``SimpleElasticAgent._exit_barrier`` in
``torch.distributed.elastic.agent.server.api``: ``exit_barrier_timeout``, 300 s, which
no torchrun flag or variable sets), so that the agent hosting the rendezvous store
outlives the others. After a host is lost and edgepipe's coordinator has recovered and
finished the run without it, its agent never arrives: the surviving agents waited 300 s
and then logged a ``DistStoreError`` traceback.

``python -m edgepipe.executor.agent [--exit-barrier S] TORCHRUN-ARGUMENTS`` is torchrun
(``torch.distributed.run``, every argument as torchrun takes it) whose agents wait at
most ``S`` seconds there (default :data:`EXIT_BARRIER_S`). When every agent arrives (no
host was lost) the barrier ends at once, as torchrun's; when one is missing after
``S``, the agent says so in one line on stderr and exits with its workers' status: no
traceback. ``S`` only has to cover the spread of the survivors' ends: in a run with a
coordinator (``--coordinator``) it tells every member to exit at once, and the workers
use its store, not torchrun's.

The barrier itself is torch's (``torch.distributed.elastic.utils.store.barrier`` on the
agent's store, with torch's key); only its time-out and what a time-out prints differ.
The agent class torchrun builds (``torch.distributed.launcher.api.LocalElasticAgent``)
is replaced by :class:`Agent` for this process only; a torch without it is refused in
one line.
"""

from __future__ import annotations

import sys
from typing import Any

from torch.distributed import DistError
from torch.distributed.elastic.agent.server import api as agent_api
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.utils import store as store_util
from torch.distributed.launcher import api as launcher_api

#: seconds an agent whose workers have finished waits for the others (torch: 300)
EXIT_BARRIER_S = 10.0
USAGE = "usage: python -m edgepipe.executor.agent [--exit-barrier SECONDS] TORCHRUN-ARGUMENTS"


class Agent(LocalElasticAgent):
    """torchrun's agent with an exit barrier of :data:`EXIT_BARRIER_S` (or the
    ``--exit-barrier`` given) that ends in one line when an agent is missing."""

    barrier_s = EXIT_BARRIER_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["exit_barrier_timeout"] = self.barrier_s
        super().__init__(*args, **kwargs)

    def _exit_barrier(self) -> None:
        agents = self._worker_group.group_world_size
        assert agents is not None  # set by the rendezvous, before any worker ran
        try:
            store_util.barrier(store=self._store, world_size=agents,
                               key_prefix=agent_api._TERMINAL_STATE_SYNC_ID,
                               barrier_timeout=self._exit_barrier_timeout)
        except DistError:
            print(f"edgepipe agent: not every agent of the job finished within "
                  f"{self._exit_barrier_timeout:g} s of this one (a host lost during the "
                  "run); exiting", file=sys.stderr, flush=True)


def parse(argv: list[str]) -> tuple[float, list[str]]:
    """``--exit-barrier S`` (first, if given) and torchrun's arguments; ValueError for
    a bad ``S``."""
    if argv[:1] != ["--exit-barrier"]:
        return EXIT_BARRIER_S, argv
    if len(argv) < 2:
        raise ValueError("--exit-barrier needs a number of seconds")
    try:
        seconds = float(argv[1])
    except ValueError:
        raise ValueError(f"--exit-barrier: {argv[1]!r} is not a number of seconds") from None
    if not 0 < seconds < float("inf"):
        raise ValueError(f"--exit-barrier must be a positive number of seconds, got {argv[1]}")
    return seconds, argv[2:]


def main(argv: list[str] | None = None) -> None:
    """Run torchrun with :class:`Agent` (module docstring); exit 2 with one line for a
    bad ``--exit-barrier`` or a torch whose launcher builds no ``LocalElasticAgent``."""
    try:
        seconds, rest = parse(sys.argv[1:] if argv is None else argv)
    except ValueError as exc:
        print(f"error: {exc}\n{USAGE}", file=sys.stderr)
        sys.exit(2)
    if getattr(launcher_api, "LocalElasticAgent", None) is not LocalElasticAgent:
        print("error: this torch's torchrun builds no LocalElasticAgent to configure; run "
              "torchrun itself (its agents wait 300 s for a lost host's)", file=sys.stderr)
        sys.exit(2)
    Agent.barrier_s = seconds
    launcher_api.LocalElasticAgent = Agent  # type: ignore[misc]
    from torch.distributed.run import main as torchrun

    torchrun(rest)


if __name__ == "__main__":
    main()
