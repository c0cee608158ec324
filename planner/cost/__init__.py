"""edgepipe.planner.cost.model"""
