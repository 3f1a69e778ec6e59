"""`accelify lint`: the engine that runs the rules of `accelify.rules` over a script's analysis,
rule selection and configuration, and the output formats."""
