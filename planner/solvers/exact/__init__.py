"""planner.solvers.exact"""
