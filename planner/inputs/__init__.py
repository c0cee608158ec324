"""edgepipe.planner.inputs"""
