"""Benchmark scripts (run as `python benchmarks/NAME.py`; see docs/benchmarks.md). A regular
package, so that `from benchmarks import ...` finds these modules before any `benchmarks`
package another distribution installs into site-packages (pysbd ships one)."""
