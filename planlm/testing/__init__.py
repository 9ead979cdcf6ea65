"""Fixtures for tests, benchmarks and experiments, not for a pipeline: corpora whose rules are known
(``synthetic``: action sequences with a rule, sentences made of their action's words; ``lookahead``: the corpus in
which the future shapes the present, with its Bayes-optimal LM, of ``experiments/bench_lookahead.py``), written in the layout
``planlm prepare`` writes. Nothing else in planlm imports this package (the top layer of ``.importlinter``)."""
