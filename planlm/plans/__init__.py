"""Plans: how many paths each boundary gets (policy), sampling them from a planner, and the plan cache."""
