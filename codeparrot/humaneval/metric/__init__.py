"""`evaluate` metric modules shipped with codeparrot (load them with `evaluate.load(path)`, offline)."""
