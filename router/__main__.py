from router.cli import main

main()
