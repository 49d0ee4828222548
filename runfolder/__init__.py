"""The run-folder contract, shared by every writer and reader (standard library only)."""
