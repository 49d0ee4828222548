"""`chaos init`: a scenario file for the user's own training command (command)."""
