"""Helpers of the benchmarks in examples/ and scripts/ (not examples themselves): the engine
restarts of the --autotune comparisons, the synthetic models, the cluster rows of
``examples/allreduce_benchmark.py --hosts``."""
