"""What is around the pipeline rather than in it: `make bench` (`bench.py` and its rows in `benchmarks/`),
`make demo` (`demo.py`, `demo_summary.py`), `make gpu-data` (`gpu_data.py`, the demo's data stages for the
codeparrot-small GPU runs), `make install`'s torch check (`torch_request.py`), the miniature training setup
tests and benchmarks build (`toy_run.py`), and the PNG plots (`plots.py`)."""
