"""The review queue: a writer's destructive ops held for a human (policy `review`)."""
