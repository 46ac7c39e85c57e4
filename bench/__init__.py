"""Benchmarks: forgetting quality side by side, and the cost of every stage (issue 7).

`python -m bench run --quick|--full` writes docs/benchmarks.md, its plots under
docs/bench/ and docs/benchmarks.json.  One module per family: quality,
continual, cost, service; report writes the documents.  A figure that could
not be measured is recorded as ``{"not_measured": reason}``, never invented.
"""
