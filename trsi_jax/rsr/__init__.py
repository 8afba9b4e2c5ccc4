"""RSR (Recursive Self-Rewrite): collect successes, rewrite them as runbooks, replay, SFT."""
