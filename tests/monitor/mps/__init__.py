"""Tests of the node agent's MPS back end (monitor/mps/, MPS mode in Allocate and registration)."""
