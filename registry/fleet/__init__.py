"""Serving workers and what they are told and tell: the desired state and its publication, acks and reports, the live feed."""
