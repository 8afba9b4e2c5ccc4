"""Task environments: the built-in procedurally generated suite (`sandboxes.suite`) and docker assets."""
