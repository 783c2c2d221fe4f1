"""Pictures: training curves (and, later, attention maps)."""
