"""Tests of the node agent (monitor/)."""
