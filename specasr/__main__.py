from specasr.cli import run

run()
