"""Tests of metrics."""
