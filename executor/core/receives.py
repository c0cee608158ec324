"""A rank's receives of one step, posted ahead of their RECV actions (docs/lab.md,
"Receives posted early").

gloo moves a point-to-point message only once its receiver has posted the receive (the
TCP pair sends an unbound buffer on the peer's ``NOTIFY_RECV_READY``), so a receive
posted at its action makes the sender's data wait until the receiver, busy computing,
reaches that action. :class:`StepReceives` posts each receive up to ``ahead`` RECV actions
of its direction early and waits for it at its action; the schedule stays the planner's.

Inputs: the rank's :class:`~executor.core.comm.StageLinks`, its action list (one step)
and ``ahead >= 0``. State per step: the posted, not yet taken receives by (direction,
micro-batch) and, per direction, how many of its RECV actions are posted. Rule: at the
step's start post the first ``ahead`` RECV_F and the first ``ahead`` RECV_B of the list,
in list order; at a RECV action take its receive (posting it now if it was not), post
the next receive of its direction not yet posted, then wait for the taken one. So
``ahead = 0`` posts every receive at its action (as before this module), and at every
moment at most ``ahead`` receives of a direction are posted and not yet taken.

**Memory**: each posted receive holds its own buffer (the rank's rows of one
micro-batch: the previous stage's output for RECV_F, this stage's for RECV_B), so
posting ahead adds at most ``ahead`` buffers of each direction to what the at-action
schedule holds. The runtime's default ``ahead`` is the stage's warm-up ``w`` (the
forwards a 1F1B stage has in flight before its first backward, K_p of
reference/asteroid.md section 3.3; M under GPipe): at most ``w`` input and ``w``
output-gradient buffers more, next to the ``w`` inputs the stage keeps anyway.

**Abort**: a step that stops early (an aborted generation's ``check()``) leaves the
receives it posted and did not take on its process group; the aborted generation's
group is abandoned with them (executor/ft/generation.py) and gloo matches messages by
(peer, tag) within one group, so they can never receive a later generation's data.

Complexity: O(actions) per step; one buffer allocation per receive, as before.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from edgepipe.executor.core.comm import Pending, StageLinks
from edgepipe.planner.schedule import Action, ActionType

#: the receive actions, in the order the rule handles them
RECEIVES = (ActionType.RECV_F, ActionType.RECV_B)


def warmup(actions: Sequence[Action]) -> int:
    """The forwards of an action list before its first backward (its stage's warm-up,
    clamped to M by the schedule); at least 1."""
    kinds = [a.type for a in actions if a.type in (ActionType.F, ActionType.B)]
    first_b = kinds.index(ActionType.B) if ActionType.B in kinds else len(kinds)
    return max(1, first_b)


class StepReceives:
    """The receives of one step (module docstring): :meth:`take` at each RECV action."""

    def __init__(self, links: StageLinks, actions: Sequence[Action], ahead: int) -> None:
        if ahead < 0:
            raise ValueError(f"receives posted ahead is {ahead}; it must be >= 0")
        self.links = links
        self.order: dict[ActionType, list[int]] = {
            kind: [a.micro_batch for a in actions
                   if a.type is kind and a.micro_batch is not None]
            for kind in RECEIVES
        }
        self.posted: dict[tuple[ActionType, int], Pending] = {}
        self.next = dict.fromkeys(RECEIVES, 0)
        for kind in RECEIVES:
            for _ in range(ahead):
                self._post_next(kind)

    def _post(self, kind: ActionType, m: int) -> Pending:
        if kind is ActionType.RECV_F:
            return self.links.recv_activations(m)
        return self.links.recv_gradients(m)

    def _post_next(self, kind: ActionType) -> None:
        order, i = self.order[kind], self.next[kind]
        if i < len(order):
            self.posted[(kind, order[i])] = self._post(kind, order[i])
            self.next[kind] = i + 1

    def take(self, kind: ActionType, m: int) -> torch.Tensor:
        """The rows of RECV_F / RECV_B ``m``, once they are in."""
        pending = self.posted.pop((kind, m), None)
        if pending is None:
            order = self.order[kind]
            if self.next[kind] >= len(order) or order[self.next[kind]] != m:
                raise RuntimeError(f"{kind.value} {m} is out of its action list's order")
            pending = self._post(kind, m)
            self.next[kind] += 1
        else:
            self._post_next(kind)
        return pending.wait()
