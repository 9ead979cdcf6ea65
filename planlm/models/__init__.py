"""The networks: the planner (h, f, g), the adapter, and the planned LM around any HF causal LM."""
