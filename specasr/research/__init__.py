"""Research tools, run as modules (`python -m specasr.research.NAME`): side-by-side speed
benchmarks (`bench`, `speedup`), the long-form fixture (`longform`), the γ/stop sweep
(`stop_sweep`) and the check of docs/benchmarks.md (`docs_check`). Nothing in the library
imports them."""
