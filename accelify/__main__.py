from accelify.cli import main

main()
