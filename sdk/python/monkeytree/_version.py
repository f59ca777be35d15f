"""The package's version, equal to package.json's (test/python/package.test.ts fails on drift):
the hook and the launcher it talks to are released together."""
__version__ = "0.1.0"
