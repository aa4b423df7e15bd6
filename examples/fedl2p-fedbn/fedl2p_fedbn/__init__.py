"""fedl2p-fedbn: an example fedl2p plugin (FedBN, a BN-only fine-tuning method, MobileNetV3-small, .npz datasets)."""
