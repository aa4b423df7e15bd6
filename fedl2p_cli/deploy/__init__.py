"""Deployment tools: the Fleet gateway in front of a Flower SuperLink (what faces the network)."""
