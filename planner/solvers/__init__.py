"""edgepipe.planner.solvers"""
