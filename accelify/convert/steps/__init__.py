"""One module per conversion item of DESIGN.md; `accelify.convert.planner` runs them in order."""
