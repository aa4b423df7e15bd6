from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from . import options, render

stage = options.Lazy("fedl2p_cli.stages.partition")


def partition(
    dataset: str = typer.Option("fmnist-c", help="fmnist | fmnist-c (generated corruption domains) | fmnist-r (rotation domains: 10 angles 0..180, CAFeMe's RMNIST analogue) | digits | digits-c | cifar10 | cifar10-c | image-folder | speechcommands (the official Speech Commands V2 folder, 12 classes, one client per speaker) | speech-synth (the same task spoken by synthetic espeak-ng speakers, generated here: not the real dataset)."),
    alpha: float = typer.Option(0.1, help="Dirichlet concentration of each client's label mix (> 0; 1000 is ~IID, 0.1 very skewed)."),
    scheme: str = typer.Option("dirichlet", help="dirichlet = each client's labels ~ Dir(alpha) (FedL2P) | shards = each client "
                               "holds --shard-classes classes in equal amounts (pFedLA's non-IID.1, CAFeMe's shards; --alpha unused)."),
    shard_classes: int = typer.Option(4, help="Classes per client with --scheme shards (pFedLA: 4; CAFeMe: 2)."),
    clients: int = typer.Option(70, help="Number of clients, split evenly across domains (speech: the speakers with the most clips, "
                                "seen ones from the training speakers, unseen ones from the held-out speakers)."),
    samples_per_client: int = typer.Option(200, help="Samples per client (equal for every client, as in the paper)."),
    val_fraction: float = typer.Option(0.2, help="Share of each client's non-test samples held out for validation."),
    test_fraction: float = typer.Option(0.2, help="Share of each client's samples held out for testing."),
    unseen_fraction: float = typer.Option(0.2, help="Share of each domain's clients put in the unseen pool (never meta-trained on); "
                                          "speech: the share of --clients that are held-out (validation and test list) speakers."),
    unseen_domains: Optional[str] = typer.Option(None, help="Comma-separated domains whose clients are all unseen."),
    corruptions: Optional[str] = typer.Option(None, help="Comma-separated domains: generated corruptions for fmnist-c/digits-c "
                                              "(default clean,gaussian_noise,gaussian_blur,contrast,brightness,invert,pixelate), rotations rotate<degrees> "
                                              "(fmnist-r default rotate0,rotate20,...,rotate180) or CIFAR-10-C types."),
    severity: int = typer.Option(3, help="Corruption severity 1..5."),
    domain_alpha: Optional[str] = typer.Option(None, help="Per-domain --alpha, e.g. clean=0.05,invert=1000: clients of "
                                               "those domains draw their label mix from Dir(value); the others from --alpha."),
    domain_samples: Optional[str] = typer.Option(None, help="Per-domain --samples-per-client, e.g. clean=60 (>= 3)."),
    domain_severity: Optional[str] = typer.Option(None, help="Per-domain --severity of generated corruptions, e.g. contrast=5."),
    spectrogram: int = typer.Option(32, help="Speech datasets: log-mel bins and frames per one-second clip (8..256; the authors' "
                                    "code uses 128 x 128, 32 keeps the CPU benchmark practical)."),
    seed: int = typer.Option(0, help="Seed of every random draw; the same seed gives an identical partition."),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", envvar="FEDL2P_DATA", help="Where the dataset files are (docs/guide/data.md lists each dataset's layout)."),
    download: bool = typer.Option(False, help="Allow torchvision to download the dataset when it is not found."),
    exclude: Optional[str] = typer.Option(None, "--exclude", help="A partition artifact id whose source images these clients "
                                          "must not get (e.g. the partition a model was pretrained on, so that personalising "
                                          "it to these clients uses images it never saw)."),
    plot: bool = typer.Option(True, help="Write label_mix.png, a heatmap of the clients' label mixes."),
    force: bool = options.FORCE,
    store: Optional[Path] = options.STORE,
) -> None:
    """Split a dataset into clients (Dirichlet label skew, feature-shift domains, seen/unseen pools) -> partition.h5."""
    cfg = stage.PartitionConfig(
        dataset=dataset, alpha=alpha, clients=clients, samples_per_client=samples_per_client, val_fraction=val_fraction,
        test_fraction=test_fraction, seed=seed, unseen_fraction=unseen_fraction,
        unseen_domains=options.csv_list(unseen_domains) or [], corruptions=options.csv_list(corruptions), severity=severity,
        data_dir=str(data_dir) if data_dir else None, download=download, exclude=exclude, scheme=scheme,
        shard_classes=shard_classes, domain_alpha=options.domain_values(domain_alpha, float, "--domain-alpha"),
        domain_samples=options.domain_values(domain_samples, int, "--domain-samples"),
        domain_severity=options.domain_values(domain_severity, int, "--domain-severity"), spectrogram=spectrogram)
    art, reused = stage.run(cfg, options.store(store), force, plot)
    show(art.metrics)
    render.artifact_line("partition", art.id, art.path, reused)


def show(m: dict) -> None:
    rows = [[d["domain"], d["seen"], d["unseen"], d["label_entropy"]] for d in m["domains"]]
    render.table(f"{m['clients']} clients, {m['samples']} samples; mean label entropy {m['mean_label_entropy']:.3f} "
                 f"(max {m['max_label_entropy']:.3f} nats)", ["domain", "seen", "unseen", "label entropy"], rows)
