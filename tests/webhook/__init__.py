"""Tests of the admission webhook (webhook/)."""
