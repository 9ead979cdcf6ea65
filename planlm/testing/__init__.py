"""Fixtures for tests and benchmarks, not for a pipeline: corpora whose rules are known (``synthetic``: action
sequences with a rule, sentences made of their action's words), written in the layout ``planlm prepare`` writes. Nothing else in planlm imports this package (the top layer of
``.importlinter``)."""
