"""Tests of cgroups."""
