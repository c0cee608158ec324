"""The cost model: time and memory of a partition. The one place these formulas live.

Every planner, the plan file, the comparison and the executor's report use this package
(the simulator does not: it is the independent reference the figures are checked
against, :mod:`planner.check.simulator`). Formulas follow the Asteroid reconstruction
(reference/asteroid.md §3); the decisions it leaves open are fixed here and recorded in
docs/decisions.md.

Three levels of truth, each a field of ``PlanCost`` (:meth:`model.CostModel.evaluate`):

1. ``iteration_ms``, what every plan reports: the plan's schedule run by every device
   on its own samples, every piece and ring chunk a transfer on the network's channels,
   transfers in progress at once sharing them max-min fairly (:mod:`makespan`,
   :mod:`fair_sharing`). The DP re-ranks its best candidates, and every planner scores
   its answer, by it; docs/cost-model.md states where it is exact against the simulator
   and where it approximates.
2. ``chain_ms``: the older chain recurrence (one resource per chain step,
   :func:`chain.schedule_makespan`), which is what the exact solver's program computes.
3. ``closed_form_ms``: Asteroid's closed form over the chain (:func:`chain.closed_form_latency`,
   Eqs. 4-6, 11); the planners' own closed form, the DP's objective, extends it
   (:func:`closed_form.pipeline_closed_form_ms`).

Modules, lower first (a module imports only those above it):

- :mod:`formulas`: ring all-reduce (§3.3), point-to-point transfer, memory per device
  (Eq. 3) and the samples and warm-up that fit it, the replication interval that hides
  a transfer.
- :mod:`channels`: the network's channels per topology, their loads, max-min fair shares
  (Bertsekas & Gallager §6.5.2), a migration's time and a replication point's beside
  training.
- :mod:`transfers`: a boundary's micro-batch re-sliced into pieces by sample interval, a
  ring all-reduce's chunks (§3.3).
- :mod:`steps`: the plan as a chain of steps (§1, §3.2; Eq. 8).
- :mod:`order`: the plan's schedule (cached) and topological orders of its actions.
- :mod:`chain`: the chain's two round times (closed form, Eqs. 4-6, 11; longest path).
- :mod:`fair_sharing`: the round as a fluid event simulation where channels are shared.
- :mod:`makespan`: the round's iteration time (longest path point to point, else the
  fair-sharing simulation).
- :mod:`model`: :class:`~model.CostModel` (per-type prefix tables of block times at a
  batch size, §2; stage compute Eq. 8; memory with ring replicas, §6) and its figures
  ``PlanCost`` / ``StageCost``.
- :mod:`closed_form`: the planners' closed form (the DP's objective) and its boundary
  terms.
"""
