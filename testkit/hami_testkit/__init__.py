"""The embedded simulated cluster for ``make demo`` and end-to-end tests (kmock plus small stand-ins)."""
