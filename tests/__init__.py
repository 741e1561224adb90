"""The copyless test suite. A package, so every test folder imports the shared code as ``tests.support``."""
