"""accelify's lint rules: one module per rule, named for what it catches. The catalog is every
module here (`accelify.lint.registry` walks the package)."""
