"""fedl2p's own models, datasets, methods, pFL systems, pretraining algorithms, executors and meta-gradients,
registered through the same plugin registry (fedl2p_cli/plugins.py) as a user's: this module is the first plugin
every process loads."""

from __future__ import annotations


def register(registry) -> None:
    from .algorithms import aggregators, heads, local, lr_grads, meta_inputs, meta_signals, server_steps
    from .algorithms.meta_grads import BUILTIN as META_GRADS
    from .data.builtin_sources import SOURCES
    from .engine.batched import Batched
    from .engine.executors import Local
    from .flower.executor import Flower
    from .methods.builtin import METHODS, SYSTEMS_BUILTIN
    from .models import zoo

    registry.add_model("small-cnn", zoo.small_cnn, "3 conv-BN-ReLU blocks (16/32/64 ch) + linear; CPU-friendly")
    registry.add_model("resnet18-cifar", zoo.resnet18_cifar, "ResNet-18, 3x3 stem, no max-pool (paper, CIFAR)")
    registry.add_model("resnet18", zoo.resnet18_imagenet, "ResNet-18, ImageNet layout (for --init torchvision weights)")
    registry.add_model("resnet18-speech", zoo.resnet18_imagenet, "ResNet-18 for 1-channel log-mel spectrograms, ImageNet "
                       "stem (paper, Speech Commands; for --spectrogram 128)")
    registry.add_model("tiny-smooth", zoo.tiny_smooth, "tiny Softplus/AvgPool model for float64 gradient checks")
    for source in SOURCES:
        registry.add_dataset(source)
    for method in METHODS:
        registry.add_method(method)
    for system in SYSTEMS_BUILTIN:
        registry.add_system(system)
    registry.add_pretrain_algo("fedavg", local.sgd_client, "FedAvg: local SGD, sample-weighted mean",
                               client_many=local.sgd_clients)
    registry.add_pretrain_algo("fedbabu", local.sgd_client, "FedBABU: the classifier frozen while training",
                               freeze_head=True, client_many=local.sgd_clients)
    registry.add_pretrain_algo("perfedavg-hf", local.perfedavg_client, "Per-FedAvg with Hessian-free MAML steps",
                               client_many=local.perfedavg_clients)
    for executor in (Local(), Flower(), Batched()):
        registry.add_executor(executor)
    for meta_grad in META_GRADS:
        registry.add_meta_grad(meta_grad)
    for head in heads.BUILTIN:
        registry.add_meta_head(head)
    for step in server_steps.BUILTIN:
        registry.add_server_step(step)
    for lr_grad in lr_grads.BUILTIN:
        registry.add_lr_grad(lr_grad)
    for entry in meta_inputs.BUILTIN:
        registry.add_meta_inputs(entry)
    for signal in meta_signals.BUILTIN:
        registry.add_meta_signal(signal)
    for aggregator in aggregators.BUILTIN:
        registry.add_aggregator(aggregator)
