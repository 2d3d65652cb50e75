"""llmlaunch tests."""
