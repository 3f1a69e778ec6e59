"""Edits of a script, shared by `accelify convert` and `accelify lint --fix`: a `Plan` of edits
keyed by the nodes of the untouched tree, applied in one pass, shown as a unified diff."""
