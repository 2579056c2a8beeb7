"""The lab: side-by-side speed benchmarks (`bench` lives in the package as `specasr.eval.bench`,
behind `specasr bench`; here `speedup`, `whole_process`, `startup`, `gpu` ...), sweeps
(`stop_sweep`, `device_gamma`), probes (`bandwidth`, `batch_costs`, `half_weights` ...), the
long-form fixture (`longform`) and the check of docs/benchmarks.md (`docs_check`).

Not part of the wheel: run from a checkout, at the repository root, as
`python -m benchmarks.NAME ...` (e.g. `python -m benchmarks.speedup --repeats 5`, with the
package installed, `pip install -e .`). Many default to the checkout's `tests/data` clips.
Nothing in `specasr` imports this folder; its tests are in benchmarks/tests.
"""
