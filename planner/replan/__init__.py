"""edgepipe.planner.replan"""
