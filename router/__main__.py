from router.server import main

main()
