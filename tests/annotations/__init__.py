"""Tests of the annotation codec (hami.annotations)."""
