"""Plotly figures of kvlab results: plain functions from result dataclasses to `go.Figure`."""
