"""Tests of strategies."""
