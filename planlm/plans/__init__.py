"""Plans: what a user sets and a command resolves (config), the kinds of plans and their registry, the sources a
split's plans are read from, how many paths each boundary gets (policy), a planner's draws and the plan cache."""
