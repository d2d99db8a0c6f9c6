"""Headless benchmarks behind `python -m kvlab bench <name>`. Each returns a JSON-ready dict."""
