"""planner.solvers.dp"""
