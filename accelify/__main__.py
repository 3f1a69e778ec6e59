from accelify.cli import main

main(prog_name="accelify")
