from qpart.cli import main

main()
