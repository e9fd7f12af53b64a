"""The sandboxed code_eval metric: `evaluate.load(codeparrot.pass_at_k.METRIC_DIR)`."""
