"""The CUDA backend: what the device loop (`specasr.decode.graphed`) needs of CUDA itself, graph
capture and replay on a side stream (`graphs`). The loop's algorithm stays in `decode`; its
passes run the runtime's layer steps, so the same code runs eagerly on a CPU in the tests."""
