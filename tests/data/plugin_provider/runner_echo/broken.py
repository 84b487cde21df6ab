"""A plug-in whose module fails when imported."""

raise RuntimeError("the echo plug-in's broken module was imported")
