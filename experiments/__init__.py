"""Research experiments that print result tables; a package so that tests import them (``from experiments import
bench_lookahead``). Each is also a script: ``python experiments/NAME.py``."""
