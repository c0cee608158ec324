"""The exact planner: a mixed-integer program over a larger space than the DP's, solved
per (micro-batch size B, stage count P) by CP-SAT, CBC or HiGHS; entry point
:func:`planner.solvers.exact.solver.plan_milp`.

Search space (larger than :mod:`planner.solvers.dp.driver`'s): any device may serve any
stage in any order (no fixed device order, no contiguous device runs), stages take
contiguous block ranges, every device of a stage takes an integer number of samples
>= 1 of each micro-batch (devices may stay idle), the micro-batch size comes from the
candidates, and every device must fit its stage's weights, gradients, optimizer state
and K_p in-flight micro-batches of activations (Eq. 3, K_p from
:meth:`TrainingConfig.warmup_depth`) plus, with ring replication on, the replica it
holds (:mod:`planner.replan.replicas`). Every figure is the one of
:mod:`planner.cost.model`. The programs' rows price a plan at or below the cost model's
iteration time (``PlanCost.iteration_ms``), equal on the class of plans
:mod:`planner.solvers.exact.formulation` names, so a program's bound is a bound on the
cost model's figure. Incumbents, the cutoff, the bound and the gap are all in that figure; a
solution is re-scored by the cost model, and a program counts as solved only when its
optimum's re-scored figure equals the program's value; a solution it priced too low is
excluded (a no-good cut) and the program solved again.

Symmetry: devices with the same type, usable memory and slowdown and no per-pair link
override are interchangeable (same times, memory and network figures), so they form a
*class* k with ``count_k`` members and the program counts devices per (stage, class,
samples) instead of naming them: a plan and every renaming of devices within their
classes are one assignment of the decision variables (block cuts, counts, replica
holder), so the search has no symmetric copies to break, and its size does not grow
with the class counts. A device with a per-pair link override is a class of
its own, which keeps every network figure a function of the classes involved.

Where each part lives:

    solver        :func:`plan_milp`, the driver: warm start, the (B, P) programs' order
                  and pruning by their closed-form bounds, the proof status and gap
                  (the decomposition, in its docstring);
    search        the programs' search: each built under the incumbent's cutoff, solved,
                  re-scored by the cost model, a loose plan excluded; two passes;
    bounds        bounds without a solver: :func:`quick_bound`, the min-max
                  :func:`program_bounds` (bisection on T), the time horizon;
    stage_bounds  the feasibility DP :func:`program_bounds` bisects over;
    fractional    a cheap bound with stages cut anywhere (no table over block pairs),
                  computed before the min-max one;
    tables        per-class block, memory and network tables, ring coefficients and the
                  stages' action orders, from the cost model, shared by every program;
    formulation   the program of one (B, P): variables and constraints, how each stands
                  to the cost model (exact or relaxed), and the no-good cut;
    linear_model  the backend-neutral linear model the formulation builds;
    solutions     between plans and a program's values: hint, extract, decision, pin;
    backends      the model lowered to CP-SAT, CBC or HiGHS (``cpsat`` | ``cbc`` |
                  ``highs``) and solved under a time limit.
"""
