"""The koordqos test suite: tests/<package>/test_<module>.py mirrors src/koordqos/<package>/<module>.py."""
