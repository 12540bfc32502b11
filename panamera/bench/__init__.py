"""`panamera bench`: the paper's experiments rerun, modeled from each plan (and timed on a GPU
where one exists). suites.py holds the workloads, baselines.py the plans compared, runner.py
the measurement and the summary, plots.py the figures."""

from .runner import run_bench

__all__ = ["run_bench"]
