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
from torch.distributed.elastic.rendezvous import RendezvousError, RendezvousHandler
from torch.distributed.elastic.rendezvous.api import RendezvousInfo
from torch.distributed.elastic.utils import store as store_util
from torch.distributed.launcher import api as launcher_api

#: seconds an agent whose workers have finished waits for the others (torch: 300)
EXIT_BARRIER_S = 10.0
USAGE = "usage: python -m edgepipe.executor.agent [--exit-barrier SECONDS] TORCHRUN-ARGUMENTS"


def say(line: str) -> None:
    """The agent's one line on stderr."""
    print(f"edgepipe agent: {line}", file=sys.stderr, flush=True)


class StoreWatch(RendezvousHandler):
    """torchrun's rendezvous handler, except once its store is unreachable (host 0, whose
    agent hosts it, lost): then the agent's membership check finds no node waiting
    (rather than raising, which made the agent stop its workers mid-run), its heartbeats
    stop, and the rendezvous is not closed at the end (its store is gone); said in one
    line. Every other call is the handler's."""

    def __init__(self, handler: RendezvousHandler) -> None:
        self.handler = handler
        #: why the store is taken for lost (None: it is not)
        self.lost: str | None = None

    def _lose(self, exc: Exception) -> None:
        self.lost = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        stop = getattr(self.handler, "_stop_heartbeats", None)  # the c10d handler's
        if callable(stop):
            stop()
        say(f"the job's rendezvous store (host 0's agent) is unreachable ({self.lost}); this "
            "host's workers go on, under edgepipe's coordinator where the job has one")

    def num_nodes_waiting(self) -> int:
        if self.lost is None:
            try:
                return self.handler.num_nodes_waiting()
            except (RendezvousError, DistError) as exc:
                self._lose(exc)
        return 0

    def shutdown(self) -> bool:
        if self.lost is not None:
            return False
        try:
            return self.handler.shutdown()
        except (RendezvousError, DistError):
            return False

    def next_rendezvous(self) -> RendezvousInfo:
        return self.handler.next_rendezvous()

    def get_backend(self) -> str:
        return self.handler.get_backend()

    @property
    def use_agent_store(self) -> bool:
        return self.handler.use_agent_store

    def is_closed(self) -> bool:
        return self.handler.is_closed()

    def set_closed(self) -> None:
        self.handler.set_closed()

    def get_run_id(self) -> str:
        return self.handler.get_run_id()


class Agent(LocalElasticAgent):
    """torchrun's agent with an exit barrier of :data:`EXIT_BARRIER_S` (or the
    ``--exit-barrier`` given) that ends in one line when an agent is missing, and a
    rendezvous handler that outlives its store (:class:`StoreWatch`)."""

    barrier_s = EXIT_BARRIER_S

    def __init__(self, spec: agent_api.WorkerSpec, *args: Any, **kwargs: Any) -> None:
        # the same spec object whose handler torchrun shuts down at the end
        self.watch = spec.rdzv_handler = StoreWatch(spec.rdzv_handler)
        kwargs["exit_barrier_timeout"] = self.barrier_s
        super().__init__(spec, *args, **kwargs)

    def _exit_barrier(self) -> None:
        agents = self._worker_group.group_world_size
        assert agents is not None  # set by the rendezvous, before any worker ran
        workers = f"this host's workers {self._worker_group.state.name.lower()}"
        if self.watch.lost is not None:
            say(f"{workers}; the rendezvous store was lost with host 0: not waiting for "
                "the other agents; exiting")
            return
        try:
            store_util.barrier(store=self._store, world_size=agents,
                               key_prefix=agent_api._TERMINAL_STATE_SYNC_ID,
                               barrier_timeout=self._exit_barrier_timeout)
        except DistError:
            say(f"{workers}; not every agent of the job finished within "
                f"{self._exit_barrier_timeout:g} s of this one (a host lost during the "
                "run); exiting")


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
