"""edgepipe.planner.cli.main"""
