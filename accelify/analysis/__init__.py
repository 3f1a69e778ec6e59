"""Every fact about one script that `convert` and `lint` ask for, computed in one libcst pass."""
