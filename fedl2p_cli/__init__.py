"""fedl2p: Federated Learning to Personalize, as a staged command-line toolkit."""

__version__ = "0.1.0"
