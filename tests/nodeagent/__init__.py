"""Tests of the node agent (nodeagent/)."""
