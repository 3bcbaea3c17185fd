"""The test suite (a package, so shared kits import as ``tests.builders``)."""
