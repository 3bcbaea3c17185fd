"""Tests of the node agent's MPS back end (nodeagent/mps/, MPS mode in Allocate and registration)."""
