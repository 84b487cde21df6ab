"""A provider plug-in for llm-job-runner's tests."""
