"""edgepipe.planner.check"""
