"""``planlm run``: the stages of a run config, the run folder, and the report."""
