"""Speech Commands V2 (12 classes) from the official folder, as log-mel spectrogram 'images', one client per speaker.

Layout read (the official archive, unpacked): `ROOT/<word>/<speaker>_nohash_<n>.wav` (16 kHz mono),
`ROOT/validation_list.txt` and `ROOT/testing_list.txt` (paths relative to ROOT; the dataset puts each speaker in
exactly one of train / validation / test), and `ROOT/_background_noise_/*.wav`.

The paper's setup (Sec. 4, App. F): the 12-class version (10 words, "unknown" for every other word, "silence"), one
client per speaker; the seen pool is the training speakers with the most clips, the unseen pool the validation and
test speakers with the most clips. "Silence" clips are cut from the background-noise recordings, 10% on top of each
speaker's clips (as the authors' code does). Features are computed once, here, with numpy and scipy only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import DataError
from .datasets import Dataset, channel_stats

SAMPLE_RATE = 16000
WORDS = ["yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go"]
CLASSES = WORDS + ["unknown", "silence"]
NOISE_DIR = "_background_noise_"
SILENCE_SHARE = 0.1                 # silence clips added per speaker, as a share of its clips (the authors' code)
DB_TOP, DB_RANGE = -10.0, 80.0      # log-mel dB window mapped onto uint8: absolute, so loudness stays a feature
POOLS = ["train-speakers", "heldout-speakers"]  # the partition's two domains: seen and unseen speakers
_CLIP = re.compile(r"^(?P<speaker>[^/_]+)_nohash_(?P<n>\d+)\.wav$")


@dataclass
class Clip:
    path: Path
    word: str
    speaker: str

    @property
    def label(self) -> int:
        return CLASSES.index(self.word) if self.word in WORDS else CLASSES.index("unknown")


# -- reading -------------------------------------------------------------------------------------

def read_wav(path: Path) -> np.ndarray:
    """A 16 kHz mono wav as float32 in [-1, 1]; any other rate, or no samples at all, is refused."""
    from scipy.io import wavfile
    try:
        rate, x = wavfile.read(path)
    except (ValueError, OSError) as e:
        raise DataError(f"{path} is not a readable wav file ({e})") from None
    if rate != SAMPLE_RATE:
        raise DataError(f"{path} is sampled at {rate} Hz; Speech Commands is {SAMPLE_RATE} Hz (resample it first)")
    if x.ndim > 1:
        x = x.mean(axis=1)
    if x.size == 0:
        raise DataError(f"{path} holds no samples")
    if np.issubdtype(x.dtype, np.integer):
        return x.astype(np.float32) / float(np.iinfo(x.dtype).max + 1)
    return x.astype(np.float32)


def _lines(root: Path, name: str) -> set[str]:
    f = root / name
    if not f.is_file():
        raise DataError(f"Speech Commands folder {root} has no {name} (the official speaker split)")
    return {ln.strip() for ln in f.read_text().splitlines() if ln.strip()}


def scan(root: Path | None) -> tuple[dict[str, list[Clip]], set[str]]:
    """Every clip by speaker, and the held-out speakers (those in the validation and testing lists)."""
    if root is None or not Path(root).is_dir():
        raise DataError(f"speechcommands needs --data-dir with the official Speech Commands folder (got {root})")
    root = Path(root)
    heldout_files = _lines(root, "validation_list.txt") | _lines(root, "testing_list.txt")
    by_speaker: dict[str, list[Clip]] = {}
    heldout: set[str] = set()
    for word_dir in sorted(p for p in root.iterdir() if p.is_dir() and p.name != NOISE_DIR):
        for f in sorted(word_dir.glob("*.wav")):
            m = _CLIP.match(f.name)
            if m is None:
                continue
            by_speaker.setdefault(m["speaker"], []).append(Clip(f, word_dir.name, m["speaker"]))
            if f"{word_dir.name}/{f.name}" in heldout_files:
                heldout.add(m["speaker"])
    if not by_speaker:
        raise DataError(f"no <word>/<speaker>_nohash_<n>.wav clips under {root}")
    return by_speaker, heldout


def most_data(by_speaker: dict[str, list[Clip]], speakers: set[str], n: int, pool: str) -> list[str]:
    """The `n` speakers of `speakers` with the most clips (ties by name, so the choice is deterministic)."""
    ranked = sorted(speakers, key=lambda s: (-len(by_speaker[s]), s))
    if len(ranked) < n:
        raise DataError(f"{n} {pool} speakers were asked for but the folder has {len(ranked)}; lower --clients "
                        "or --unseen-fraction")
    return ranked[:n]


# -- features ------------------------------------------------------------------------------------

def fit_second(x: np.ndarray) -> np.ndarray:
    """Zero-pad or crop (centred) to exactly one second."""
    if x.size >= SAMPLE_RATE:
        start = (x.size - SAMPLE_RATE) // 2
        return x[start:start + SAMPLE_RATE]
    return np.pad(x, (0, SAMPLE_RATE - x.size))


def mel_filters(bins: int, n_fft: int) -> np.ndarray:
    """Triangular HTK-mel filters [bins, n_fft // 2 + 1] from 20 Hz to Nyquist."""
    mel = lambda f: 2595.0 * np.log10(1.0 + f / 700.0)  # noqa: E731
    hz = lambda m: 700.0 * (10 ** (m / 2595.0) - 1.0)  # noqa: E731
    edges = hz(np.linspace(mel(20.0), mel(SAMPLE_RATE / 2), bins + 2))
    freqs = np.linspace(0, SAMPLE_RATE / 2, n_fft // 2 + 1)
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    return np.maximum(0.0, np.minimum((freqs - lo) / (mid - lo), (hi - freqs) / (hi - mid)))


def log_mel(waves: np.ndarray, size: int) -> np.ndarray:
    """One-second clips [N, 16000] -> uint8 log-mel spectrograms [N, 1, size, size] (mel bins x frames).

    Frames are 1/size s apart with a Hann window of twice that; power is relative to a full-scale sine and the
    window [DB_TOP - DB_RANGE, DB_TOP] dB maps linearly onto 0..255."""
    hop = SAMPLE_RATE // size
    n_fft = 1 << int(np.ceil(np.log2(2 * hop)))
    window = np.hanning(n_fft + 1)[:-1].astype(np.float32)
    padded = np.pad(waves, ((0, 0), (n_fft // 2, n_fft // 2)))
    starts = np.arange(size) * hop
    frames = np.stack([padded[:, s:s + n_fft] for s in starts], axis=1) * window      # [N, frames, n_fft]
    power = np.abs(np.fft.rfft(frames, axis=-1)) ** 2 / (window.sum() / 2) ** 2     # a full-scale sine: 1
    energy = power @ mel_filters(size, n_fft).T                                     # [N, frames, bins]
    db = 10.0 * np.log10(np.maximum(energy, 1e-12))
    scaled = (db - (DB_TOP - DB_RANGE)) / DB_RANGE * 255.0
    return np.clip(np.round(scaled), 0, 255).astype(np.uint8).transpose(0, 2, 1)[:, None, ::-1].copy()


def silence(noises: list[np.ndarray], n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` one-second clips cut at random from random background-noise recordings."""
    out = np.zeros((n, SAMPLE_RATE), dtype=np.float32)
    for i in range(n):
        x = noises[rng.integers(len(noises))]
        start = rng.integers(0, max(1, x.size - SAMPLE_RATE + 1))
        out[i] = fit_second(x[start:start + SAMPLE_RATE])
    return out


# -- the dataset ---------------------------------------------------------------------------------

def load_speech_commands(root: Path | None, seen: int, unseen: int, size: int = 32, seed: int = 0,
                         name: str = "speechcommands") -> Dataset:
    """The chosen speakers' clips (seen first, each pool by decreasing data), with silence added per speaker.

    `domains` holds the pool (0 = training speakers, 1 = held-out speakers), `groups` the speaker of each clip."""
    by_speaker, heldout = scan(root)
    assert root is not None  # scan refused None
    chosen = [(s, 0) for s in most_data(by_speaker, set(by_speaker) - heldout, seen, "training")]
    chosen += [(s, 1) for s in most_data(by_speaker, heldout, unseen, "held-out")]
    noise_dir = Path(root) / NOISE_DIR
    noises = [read_wav(f) for f in sorted(noise_dir.glob("*.wav"))] if noise_dir.is_dir() else []
    if not noises:
        raise DataError(f"{noise_dir} holds no wav files; the 'silence' class is cut from them")
    rng = np.random.default_rng(seed)
    waves, labels, groups, pools = [], [], [], []
    for g, (speaker, pool) in enumerate(chosen):
        clips = by_speaker[speaker]
        n_sil = int(round(SILENCE_SHARE * len(clips)))
        waves += [fit_second(read_wav(c.path)) for c in clips] + list(silence(noises, n_sil, rng))
        labels += [c.label for c in clips] + [CLASSES.index("silence")] * n_sil
        groups += [g] * (len(clips) + n_sil)
        pools += [pool] * (len(clips) + n_sil)
    images = torch.from_numpy(np.concatenate([log_mel(np.stack(waves[i:i + 512]), size)
                                              for i in range(0, len(waves), 512)]))
    mean, std = channel_stats(images)
    return Dataset(name, images, torch.tensor(labels, dtype=torch.int64), list(CLASSES), mean, std,
                   torch.tensor(pools, dtype=torch.int64), list(POOLS), torch.tensor(groups, dtype=torch.int64),
                   [s for s, _ in chosen])
