"""The answer parsers, one concern a module; ``runner.evaluate.parse`` is their public face and states the rules."""
