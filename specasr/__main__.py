from specasr.cli import main

main()
