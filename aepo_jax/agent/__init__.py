"""Agent side: tag protocol, trajectories and the multi-turn loop."""
