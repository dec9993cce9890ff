"""Tests of chart."""
