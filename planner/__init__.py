"""edgepipe's planner: profiles, cost model, simulator and planners (pure Python, no torch).

Typical use::

    from planner import api
    problem = api.load_problem("pipedream-vgg16", "jetson-testbed-6", global_batch=32)
    plan = api.solve(problem)           # Asteroid-style DP
    api.save_plan(plan, "plan.json")
"""
