from skewwatch.cli import main

main()
